"""The process-wide engines: one per ``(model folder, device, dtype, engine settings)``.

This module keeps its own map of what :func:`get_engine` built, keyed by those four (the
settings as ``(name, repr(value))`` pairs); a closed engine is dropped from it on the next
call. Engines stop at interpreter exit through their driver (``engine.driver``).

Lifetime: an engine asked for with a ``holder`` (a chat model's engine handles) is held
while some holder lives. One no holder holds any more stays, for the next chat model with
its settings (LangChain builds a model per call for ``configurable_fields``), until another
engine starts: then it is shut down first and its weights and KV cache are freed before the
new one loads (a notebook that rebuilds a chat model with other settings does not keep every
earlier engine). An engine asked for without a holder - a direct :func:`get_engine` call,
``AscendChatModel.get_engine()``, a server - is pinned: it lives until its ``shutdown()`` or
the interpreter's exit.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import weakref
from typing import Any

from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.platform import resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

_REGISTRY: dict[tuple[Any, ...], LLMEngine] = {}
_REGISTRY_LOCK = threading.RLock()  # a holder may be collected, and let go, inside it
_PINNED: set[tuple[Any, ...]] = set()
_HOLDERS: dict[tuple[Any, ...], int] = {}
"""Live holders per engine key (module docstring)."""
_HELD: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
"""The engines (``id``) each live holder holds."""


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
    holder: Any = None, **engine_kwargs: Any,
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

    ``holder``: an object that holds the engine while it lives (the module docstring); None
    pins the engine.

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
            _HOLDERS.pop(closed, None)
        stale = [] if key in _REGISTRY else [
            k for k in _REGISTRY if _HOLDERS.get(k) == 0 and k not in _PINNED]
        unheld = [_REGISTRY.pop(k) for k in stale]
        for k in stale:
            del _HOLDERS[k]
    for engine in unheld:  # outside the lock: their loops may be letting go of a holder
        engine.shutdown()  # freed before the new engine sizes its KV cache by the free memory
    with _REGISTRY_LOCK:
        engine = _REGISTRY.get(key)  # another thread may have started it meanwhile
        if engine is None:
            engine = _start_locked(key, place, settings, engine_kwargs)
        _hold_locked(key, holder)
        return engine


def pin_engine(engine: LLMEngine) -> None:
    """Keep ``engine`` past its holders (it was handed out: someone may use it directly)."""
    with _REGISTRY_LOCK:
        _PINNED.update(k for k, e in _REGISTRY.items() if e is engine)


def _start_locked(key: tuple[Any, ...], place: tuple[str, str, str],
                  settings: dict[str, Any], engine_kwargs: dict[str, Any]) -> LLMEngine:
    running = [k for k in _REGISTRY if k[:3] == place]
    if running:
        built = dict(running[0][3])
        differing = {name: value for name, value in settings.items()
                     if built.get(name) != repr(value)}
        logger.info("get_engine(%s): settings %s differ from the running engine's; "
                    "starting an engine of its own", place[0], differing)
    engine = LLMEngine(place[0], device=place[1], dtype=place[2], **engine_kwargs)
    _REGISTRY[key] = engine
    _HOLDERS.pop(key, None)
    _PINNED.discard(key)
    return engine


def _hold_locked(key: tuple[Any, ...], holder: Any) -> None:
    if holder is None:
        _PINNED.add(key)
        return
    engine = _REGISTRY[key]
    held = _HELD.setdefault(holder, set())
    if id(engine) not in held:
        held.add(id(engine))
        _HOLDERS[key] = _HOLDERS.get(key, 0) + 1
        weakref.finalize(holder, _let_go, key, engine).atexit = False


def _let_go(key: tuple[Any, ...], engine: LLMEngine) -> None:
    """A holder of ``engine`` is gone (its count drops; the engine is shut down, if nothing
    holds it then, when another engine starts: :func:`_start_locked`)."""
    with _REGISTRY_LOCK:
        if _REGISTRY.get(key) is engine:  # else replaced after a shutdown: not its count
            _HOLDERS[key] -= 1
