"""Native CPU kernels (C, compiled on the machine on first use) with a torch fallback.

- ``build``: compiles ``<name>.c`` from this folder once per machine and loads it, where the
  host allows (see its docstring); otherwise reports why and callers keep their torch path.
- ``paged_attention`` / ``prefill_attention``: the CPU attention backend's decode and prefill
  attention straight from the paged cache; ``decode_stack``: every layer of an owned model's
  pure-decode step in one call (``matvec``, ``qmatmul``, ``rms_norm``, ``rope_kv`` inside it).
"""
