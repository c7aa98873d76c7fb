"""Deterministic, offline tiny tokenizers and random-weight models for tests and benchmarks.

Nothing here downloads anything: tokenizers are trained on bundled/generated English text and
weights drawn from a fixed seed, so every test runs offline and sees the same model. Results
are cached once under ``models/`` of the package's cache root (or an explicit ``cache_dir``);
folder names carry a fingerprint of the builder code, data, library versions and parameters,
so a changed builder builds anew, and builds are renamed into place under a file lock, so
concurrent processes are safe. ``build_model(preset, arch)`` gives an HF folder (weights and
a Qwen2.5-style tokenizer); the real SmolLM2 and MiniLM helpers and pytest device marks live
here too. The API, presets and tokenizer guarantees: docs/testing.md.
"""

from __future__ import annotations

from langchain_ascend.testing.cache import CACHE_ENV_VAR, resolve_cache_dir
from langchain_ascend.testing.devices import accelerator_params, needs_native_kernels
from langchain_ascend.testing.gguf_writer import write_gguf
from langchain_ascend.testing.minilm import minilm_path
from langchain_ascend.testing.model_builder import (
    ALL_ARCHITECTURES,
    ARCHITECTURES,
    CHAT_TEMPLATES,
    GEMMA_SLIDING_WINDOW,
    PRESETS,
    ModelPreset,
    build_model,
    chat_template_without_tools,
    create_model,
    make_config,
)
from langchain_ascend.testing.real_model import needs_smollm2, smollm2_gguf_path, smollm2_path
from langchain_ascend.testing.tokenizer_builder import (
    ADDED_TOKENS,
    build_tokenizer,
    chat_template,
    load_tokenizer,
)

__all__ = [
    "ADDED_TOKENS",
    "ALL_ARCHITECTURES",
    "ARCHITECTURES",
    "CACHE_ENV_VAR",
    "CHAT_TEMPLATES",
    "GEMMA_SLIDING_WINDOW",
    "PRESETS",
    "ModelPreset",
    "accelerator_params",
    "needs_native_kernels",
    "build_model",
    "build_tokenizer",
    "chat_template",
    "chat_template_without_tools",
    "create_model",
    "load_tokenizer",
    "make_config",
    "minilm_path",
    "needs_smollm2",
    "smollm2_gguf_path",
    "smollm2_path",
    "resolve_cache_dir",
    "write_gguf",
]
