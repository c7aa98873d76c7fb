"""The one cache root every on-disk cache of the package lives under.

The root is ``$LANGCHAIN_ASCEND_CACHE`` when set, else ``$XDG_CACHE_HOME/langchain_ascend``
(an absolute ``XDG_CACHE_HOME`` only, as the XDG spec asks), else ``~/.cache/langchain_ascend``.
Each cache is one sub-folder of it::

    <root>/models           the tiny test models and tokenizers (langchain_ascend.testing)
    <root>/gguf             GGUF files' configs, tokenizers and de-quantized copies
    <root>/measured         warm-up's measurements of a model on this machine
    <root>/native           the C kernels built for this machine

A cache that has a variable of its own (``LANGCHAIN_ASCEND_MEASURED_CACHE``,
``LANGCHAIN_ASCEND_NATIVE_CACHE``) takes that folder as is instead.

A leaf module: standard library only, so every layer (engine, testing, native) may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "LANGCHAIN_ASCEND_CACHE"
"""The cache root (not a sub-folder): ``.ci/run`` points it inside the clone."""
XDG_ENV_VAR = "XDG_CACHE_HOME"
PACKAGE_DIR_NAME = "langchain_ascend"

MODELS = "models"
GGUF = "gguf"
MEASURED = "measured"
NATIVE = "native"


def cache_root() -> Path:
    """The absolute cache root (module docstring); not created."""
    explicit = os.environ.get(CACHE_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get(XDG_ENV_VAR)
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return (base / PACKAGE_DIR_NAME).resolve()


def cache_subdir(name: str, *, override_env: str | None = None) -> Path:
    """``<cache_root()>/<name>``, or ``$<override_env>`` as is when that variable is set;
    absolute, not created."""
    if override_env is not None and (own := os.environ.get(override_env)):
        return Path(own).expanduser().resolve()
    return cache_root() / name
