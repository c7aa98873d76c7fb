"""From a model folder to what an engine serves: the loaded runner, the tokenizer, the EOS ids.

:meth:`LoadedModel.load` reads a folder (an HF model, or the weightless folder of a GGUF
file's blocks) once: it sizes the default KV pool, loads the :class:`ModelRunner` and the
tokenizer. :class:`~langchain_ascend.engine.llm_engine.LLMEngine` takes a path (loaded here)
or a :class:`LoadedModel` made by hand (``LLMEngine.from_runner``: a fake runner in tests).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from langchain_ascend import platform
from langchain_ascend.attention.backends import backend_name_for, get_backend_class
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.cpu.models.llama_weights import folder_config
from langchain_ascend.engine.model_source.folder_tokenizer import load_folder_tokenizer
from langchain_ascend.engine.worker.kv_cache import plan_num_blocks
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.native import block_layout, build, stack_kernel

__all__ = ["LoadedModel", "default_num_blocks", "dtype_name"]


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve.

    Attributes:
        runner: The model runner (anything with the ModelRunner interface: ``block_size``,
            ``num_blocks``, ``max_model_len``, ``config``, ``device``, ``dtype``,
            ``execute``, ``release``, ``warmup``).
        tokenizer: Its tokenizer.
        model_path: The folder it came from ("" when made by hand).
        eos_token_ids: The ids a reply stops at.
    """

    runner: Any
    tokenizer: Any
    model_path: str = ""
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def by_hand(cls, runner: Any, tokenizer: Any, *, model_path: str = "",
                eos_token_ids: Any = None) -> LoadedModel:
        """A model over an already loaded runner; EOS ids default to the tokenizer's."""
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = [eos] if eos is not None else []
        return cls(runner, tokenizer, model_path, tuple(eos_token_ids))

    @classmethod
    def load(cls, model_path: str | os.PathLike[str], *, device: Any, dtype: Any,
             block_size: int | None, num_blocks: int | None, kv_cache_memory_fraction: float,
             max_batch_size: int, max_num_batched_tokens: int,
             max_context_length: int | None, compile: bool | str,
             quantization: str | None, kv_cache_dtype: str | None = "auto") -> LoadedModel:
        """Load the model at ``model_path`` (settings as for ``LLMEngine``).

        Raises:
            DeviceUnavailableError: An unusable ``device`` (before anything loads).
        """
        resolved = platform.resolve_device(device)  # an unusable device fails here, first
        if resolved.type == "cpu":  # the C kernels build while the weights load
            build.prebuild([stack_kernel.KERNEL, block_layout.KERNEL])
        path = os.fspath(model_path)
        if num_blocks is None:
            num_blocks = default_num_blocks(
                path, device=device, dtype=dtype, block_size=block_size,
                memory_fraction=kv_cache_memory_fraction, max_batch_size=max_batch_size,
                max_context_length=max_context_length)
        runner = ModelRunner.load(
            path, device=str(device), dtype=dtype_name(dtype), block_size=block_size,
            num_blocks=num_blocks, kv_cache_memory_fraction=kv_cache_memory_fraction,
            max_num_batched_tokens=max_num_batched_tokens, max_batch_size=max_batch_size,
            compile=compile, quantization=quantization, kv_cache_dtype=kv_cache_dtype,
        )
        tokenizer = load_folder_tokenizer(path)
        eos = hf_config.default_eos_token_ids(path, runner.config, tokenizer)
        return cls(runner, tokenizer, path, tuple(eos))


def default_num_blocks(path: str, *, device: Any, dtype: Any, block_size: int | None,
                       memory_fraction: float, max_batch_size: int,
                       max_context_length: int | None) -> int:
    """The default pool of the model at ``path``: room for ``max_batch_size`` requests of the
    context length (the model's when not set), bounded by ``plan_num_blocks``'s caps."""
    config = folder_config(path)  # a GGUF folder of an owned family: no transformers class
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    num_layers, num_heads, num_kv_heads, head_dim = hf_config.attention_geometry(config)
    resolved_device = platform.resolve_device(device)
    resolved_dtype = platform.resolve_dtype(dtype_name(dtype), resolved_device)
    backend_cls = get_backend_class(backend_name_for(platform.device_type(resolved_device),
                                                     "auto"))
    block_size = block_size or backend_cls.preferred_block_size()
    backend = backend_cls(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                          dtype=resolved_dtype, device=resolved_device)
    model_max = hf_config.max_position_embeddings(config)
    context = model_max if max_context_length is None else min(max_context_length, model_max)
    return plan_num_blocks(
        device=resolved_device, bytes_per_block=backend.bytes_per_block(block_size, num_layers),
        memory_fraction=memory_fraction, block_size=block_size,
        max_num_tokens=max_batch_size * context)


def dtype_name(dtype: Any) -> str:
    """``"auto"`` for None, else the dtype's name without ``torch.``."""
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")
