"""Where a chat model's requests run: its model's source, shared engine, or tokenizer alone.

:func:`model_folder` resolves a model name as the chat model gives it (``gguf_file`` and
``model_kwargs["revision"]`` belong to the chat model's own model) to the local folder the
engine loads; :func:`load_engine` returns the process-wide shared engine of that folder with
the chat model's engine settings; :func:`load_tokenizer` loads the tokenizer only (token
counting before any call: no weights, no KV cache). Imports torch only through the engine.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_ascend.engine.model_source import resolve_model_source
from langchain_ascend.engine.model_source.folder_tokenizer import load_folder_tokenizer
from langchain_ascend.errors import ModelSourceError


@dataclass(frozen=True)
class TokenizerOnly:
    """A model's tokenizer where the prompt path expects an engine (it reads ``tokenizer``)."""

    tokenizer: Any


class EngineHandles:
    """The engines a chat model loaded, by model name and engine settings (so a chat model
    whose engine settings change gets an engine of its own); each copy of a chat model has
    its own (``AscendChatModel.__copy__``). The handles are what holds the engines in the
    process-wide registry (``engine.shared_engines``): an engine no chat model's handles
    hold is freed when another engine starts.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engines: dict[tuple[Any, ...], Any] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> EngineHandles:
        return EngineHandles()  # a deep copy holds its own (the engines it asks for are shared)

    def engine(self, chat: Any, name: str) -> Any:
        """The live engine of model ``name`` with ``chat``'s settings, loaded on first use."""
        key = engine_key(chat, name)
        with self.lock:
            engine = self.engines.get(key)
        if engine is None or engine.is_closed:
            engine = load_engine(chat, name, holder=self)
            with self.lock:
                self.engines[key] = engine
        return engine

    def loaded(self, chat: Any, name: str) -> Any | None:
        """The live engine of ``name`` with ``chat``'s settings if loaded, else None."""
        with self.lock:
            engine = self.engines.get(engine_key(chat, name))
        return None if engine is None or engine.is_closed else engine


def engine_key(chat: Any, name: str) -> tuple[Any, ...]:
    """What picks the engine of model ``name`` on chat model ``chat``: the model's source
    (its file, revision and quantization), the device, the dtype and the engine settings."""
    own = name == chat.model
    return (name, chat.gguf_file if own else None,
            chat.model_kwargs.get("revision") if own else None, chat.quantization,
            repr(chat.device), repr(chat.dtype),
            tuple(sorted((k, repr(v)) for k, v in engine_kwargs(chat).items())))


def hub_revision_folder(repo_id: str, revision: str) -> Path:
    """The local snapshot of ``repo_id`` at ``revision`` (from the Hugging Face cache, else
    downloaded unless ``HF_HUB_OFFLINE`` is set).

    Raises:
        ModelSourceError: The revision is neither cached nor downloadable; names both.
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception as cached_error:  # noqa: BLE001 - every hub failure becomes our error
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true"):
            raise ModelSourceError(
                f"model {repo_id!r} at revision {revision!r} is not in the local Hugging Face "
                "cache and HF_HUB_OFFLINE is set") from cached_error
    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except Exception as error:  # noqa: BLE001
        raise ModelSourceError(
            f"model {repo_id!r} at revision {revision!r} could not be downloaded "
            f"({type(error).__name__}: {error})") from error


def model_folder(chat: Any, name: str) -> Path:
    """The local HF folder of model ``name`` for chat model ``chat`` (see the module
    docstring); a GGUF file is prepared as ``chat.quantization`` asks (only its config and
    tokenizer are written when its blocks run as they are)."""
    own = name == chat.model
    revision = chat.model_kwargs.get("revision") if own else None
    source: str | Path = hub_revision_folder(name, revision) if revision else name
    return resolve_model_source(source, gguf_file=chat.gguf_file if own else None,
                                quantization=chat.quantization).path


def engine_kwargs(chat: Any) -> dict[str, Any]:
    """The engine settings of chat model ``chat`` (unset optional ones left out)."""
    kwargs: dict[str, Any] = {
        "enable_prefix_caching": chat.enable_prefix_caching,
        "kv_cache_memory_fraction": chat.kv_cache_memory_fraction,
        "max_batch_size": chat.max_batch_size,
        "max_num_batched_tokens": chat.max_num_batched_tokens,
        "compile": chat.compile,
        "quantization": chat.quantization,
        "kv_cache_dtype": chat.kv_cache_dtype,
    }
    for key, default in (("scheduling", "fcfs"), ("session_retention", True),
                         ("retention_cap", 0.5)):  # defaults left out: engines stay shared
        if getattr(chat, key) != default:
            kwargs[key] = getattr(chat, key)
    for key, value in (("max_context_length", chat.max_context_length),
                       ("block_size", chat.block_size), ("num_blocks", chat.num_kv_blocks)):
        if value is not None:
            kwargs[key] = value
    return kwargs


def load_engine(chat: Any, name: str, holder: Any = None) -> Any:
    """The shared engine of model ``name`` on ``chat``'s device and dtype (loaded on first use),
    held by ``holder`` (None: pinned; ``engine.shared_engines``).

    Raises:
        ModelSourceError: The model cannot be found or prepared.
    """
    # The engine's stack (scheduler, runner, kernels) loads with the first model, not with
    # `import langchain_ascend.chat_models`.
    from langchain_ascend.engine.shared_engines import get_engine

    return get_engine(model_folder(chat, name), device=chat.device, dtype=chat.dtype,
                      holder=holder, **engine_kwargs(chat))


def pin(engine: Any) -> None:
    """Keep ``engine`` until its ``shutdown()``, whatever holds it
    (``engine.shared_engines.pin_engine``)."""
    from langchain_ascend.engine.shared_engines import pin_engine

    pin_engine(engine)


def load_tokenizer(chat: Any, name: str) -> TokenizerOnly:
    """Model ``name``'s tokenizer alone, as its engine would load it.

    Raises:
        ModelSourceError: The model cannot be found or prepared, or has no tokenizer.
    """
    folder = model_folder(chat, name)
    try:
        return TokenizerOnly(load_folder_tokenizer(folder))
    except (OSError, ValueError) as error:
        raise ModelSourceError(f"cannot load the tokenizer of {name} from {folder}: "
                               f"{error}") from error
