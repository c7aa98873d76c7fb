"""The process-wide engines: one per ``(model folder, device, dtype)``, stopped at exit."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_ascend.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# Engines whose loop may be running: stopped at interpreter exit so no model step is cut off
# half-way while the interpreter tears down.
_LIVE_ENGINES: weakref.WeakSet[LLMEngine] = weakref.WeakSet()


def track_live(engine: LLMEngine) -> None:
    """Have ``engine`` shut down at interpreter exit."""
    _LIVE_ENGINES.add(engine)


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("engine shutdown at exit failed", exc_info=True)


_REGISTRY: dict[tuple[str, str, str], LLMEngine] = {}
_REGISTRY_LOCK = threading.Lock()


def get_engine(
    model_path: str | os.PathLike[str], *, device: Any = "auto", dtype: Any = "auto",
    **engine_kwargs: Any,
) -> LLMEngine:
    """The process-wide engine for ``(realpath(model_path), device, dtype)``, created on first
    use so every chat model on the same weights shares one KV cache and one batch.

    ``engine_kwargs`` (see :class:`~langchain_ascend.engine.llm_engine.LLMEngine`) apply when
    the engine is created; a later call with different ones gets the existing engine (a
    warning is logged).
    """
    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.platform import resolve_device, resolve_dtype

    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    key = (os.path.realpath(os.fspath(model_path)), str(resolved_device),
           str(resolved_dtype).removeprefix("torch."))
    with _REGISTRY_LOCK:
        engine = _REGISTRY.get(key)
        if engine is not None and not engine.is_closed:
            if engine_kwargs and engine_kwargs != engine._engine_kwargs:
                logger.warning("get_engine(%s): an engine already exists; ignoring the new "
                               "engine_kwargs %s", key[0], engine_kwargs)
            return engine
        engine = LLMEngine(key[0], device=key[1], dtype=key[2], **engine_kwargs)
        engine._engine_kwargs = dict(engine_kwargs)
        _REGISTRY[key] = engine
        return engine


def forget_engine(engine: LLMEngine) -> None:
    """Drop ``engine`` from the registry and from the engines stopped at exit."""
    with _REGISTRY_LOCK:
        for key, value in list(_REGISTRY.items()):
            if value is engine:
                del _REGISTRY[key]
    _LIVE_ENGINES.discard(engine)
