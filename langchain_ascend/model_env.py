"""The one environment variable that names the chat model: ``LANGCHAIN_ASCEND_MODEL``.

``AscendChatModel()`` without ``model=``, the config's unset ``model.path``, the notebooks and
the demo's ``--config`` read it. The old name ``LANGCHAIN_ASCEND_CHAT_MODEL`` is still read,
with a ``DeprecationWarning``, when the new one is unset.
"""

from __future__ import annotations

import os
import warnings

from langchain_ascend.errors import ModelSourceError

MODEL_ENV_VAR = "LANGCHAIN_ASCEND_MODEL"
DEPRECATED_MODEL_ENV_VAR = "LANGCHAIN_ASCEND_CHAT_MODEL"


def model_from_env(*, required: bool = True) -> str | None:
    """``$LANGCHAIN_ASCEND_MODEL``, else ``$LANGCHAIN_ASCEND_CHAT_MODEL`` (deprecated: warns).

    Args:
        required: Raise when neither is set (else return None).

    Raises:
        ModelSourceError: Neither variable is set and ``required``.
    """
    value = os.environ.get(MODEL_ENV_VAR)
    if value:
        return value
    old = os.environ.get(DEPRECATED_MODEL_ENV_VAR)
    if old:
        warnings.warn(f"{DEPRECATED_MODEL_ENV_VAR} is deprecated: set {MODEL_ENV_VAR} instead",
                      DeprecationWarning, stacklevel=2)
        return old
    if required:
        raise ModelSourceError(
            f"AscendChatModel needs model= (a local folder, a .gguf file or a hub id of a chat "
            f"model), or the {MODEL_ENV_VAR} environment variable")
    return None


def required_model_from_env() -> str:
    """:func:`model_from_env` that always returns a model (a pydantic ``default_factory``)."""
    value = model_from_env(required=True)
    assert value is not None  # required=True raises instead
    return value
