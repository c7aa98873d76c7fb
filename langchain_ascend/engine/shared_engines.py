"""The process-wide engines: one per ``(model folder, device, dtype, engine settings)``.

This module keeps its own map of what :func:`get_engine` built, keyed by those four (the
settings as ``(name, repr(value))`` pairs); a closed engine is dropped from it on the next
call. Engines stop at interpreter exit through their driver (``engine.driver``).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any

from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.platform import resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

_REGISTRY: dict[tuple[Any, ...], LLMEngine] = {}
_REGISTRY_LOCK = threading.Lock()


def engine_settings(engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every :class:`~langchain_ascend.engine.llm_engine.LLMEngine` setting, the given ones
    over the constructor's defaults (so leaving a setting out and passing its default are the
    same settings).

    Raises:
        InvalidRequestError: A name that is not an engine setting.
    """
    defaults = {
        name: param.default
        for name, param in inspect.signature(LLMEngine.__init__).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("device", "dtype")
    }
    unknown = sorted(set(engine_kwargs) - set(defaults))
    if unknown:
        raise InvalidRequestError(
            f"get_engine: {', '.join(map(repr, unknown))} is not an engine setting; the "
            f"settings are {', '.join(sorted(defaults))}")
    return {**defaults, **engine_kwargs}


def get_engine(
    model_path: str | os.PathLike[str], *, device: Any = "auto", dtype: Any = "auto",
    **engine_kwargs: Any,
) -> LLMEngine:
    """The process-wide engine for ``(realpath(model_path), device, dtype, settings)``,
    created on first use, so every chat model on the same weights with the same engine
    settings shares one KV cache and one batch.

    ``engine_kwargs`` (see :class:`~langchain_ascend.engine.llm_engine.LLMEngine`) are part
    of the key: a caller asking for other settings (``max_context_length=64`` where the
    running engine uses the model's limit) gets an engine of its own with those settings,
    never the existing one with its settings silently dropped. Each engine holds its own copy
    of the weights and its own KV pool (logged when a second one is made for a model). A call
    with no ``engine_kwargs`` asks for the defaults and shares the engine that has them.

    Raises:
        InvalidRequestError: An ``engine_kwargs`` name that is not an engine setting.
    """
    settings = engine_settings(engine_kwargs)
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    place = (os.path.realpath(os.fspath(model_path)), str(resolved_device),
             str(resolved_dtype).removeprefix("torch."))
    key = (*place, tuple(sorted((name, repr(value)) for name, value in settings.items())))
    with _REGISTRY_LOCK:
        for closed in [k for k, e in _REGISTRY.items() if e.is_closed]:
            del _REGISTRY[closed]
        engine = _REGISTRY.get(key)
        if engine is not None:
            return engine
        running = [k for k in _REGISTRY if k[:3] == place]
        if running:
            built = dict(running[0][3])
            differing = {name: value for name, value in settings.items()
                         if built.get(name) != repr(value)}
            logger.info("get_engine(%s): settings %s differ from the running engine's; "
                        "starting an engine of its own", place[0], differing)
        engine = LLMEngine(place[0], device=place[1], dtype=place[2], **engine_kwargs)
        _REGISTRY[key] = engine
        return engine
