"""Paged attention plugged into transformers models (see ``registry``) and its backends."""
