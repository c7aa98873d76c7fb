"""Build and cache small random-weight causal LMs of every family with their tokenizer.

:data:`ARCHITECTURES` are the Llama-style families whose transformers modules keep q/k/v and
gate/up apart (qwen2, llama, qwen3: the engine tests run each); :data:`ALL_ARCHITECTURES` adds
gemma3, gemma2 and phi3 (their own tests), the families of ``langchain_ascend.families``.
A Gemma 3 has at least six layers, so its sliding-window pattern (five local layers, one
global) is whole, and a short window (:data:`GEMMA_SLIDING_WINDOW`) that test prompts outgrow.

The tokenizer carries the Qwen2.5-style template that renders tools (``chat_template="tools"``,
the default) or a ChatML template that ignores them like SmolLM2-Instruct's
(``chat_template="no_tools"``, :func:`chat_template_without_tools`).

Each model is made from its real transformers config class, initialised by
``AutoModelForCausalLM.from_config`` under a fixed ``torch`` seed (the global RNG state is
restored afterwards), its linear layers then redrawn with fan-in scaled normal weights (see
:func:`rescale_linear_weights`), saved with ``save_pretrained`` as safetensors, and placed in one folder
with the tokenizer files so ``AutoTokenizer`` and ``AutoModelForCausalLM`` both load from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_ascend import families
from langchain_ascend.testing.cache import (
    TOKENIZER_SOURCES,
    build_once,
    builder_fingerprint,
    resolve_cache_dir,
)
from langchain_ascend.testing.tokenizer_builder import (
    ENDOFTEXT,
    IM_END,
    build_tokenizer,
    tokenizer_files,
)

ARCHITECTURES: tuple[str, ...] = ("qwen2", "llama", "qwen3")
"""The engine test matrix: the Llama-style families built from a Llama-shaped config."""
ALL_ARCHITECTURES: tuple[str, ...] = tuple(f.name for f in families.FAMILIES)
"""Every family :func:`build_model` builds."""
GEMMA_SLIDING_WINDOW = 8
"""The tiny Gemma models' sliding window (tokens), shorter than the test prompts."""
_GEMMA3_LAYERS = 6
# "tools": the tokenizer's own Qwen2.5-style template; "no_tools": role + content only.
CHAT_TEMPLATES: tuple[str, ...] = ("tools", "no_tools")
_NO_TOOLS_TEMPLATE_FILE = "data/chatml_no_tools.jinja"
_MODEL_SOURCES = (*TOKENIZER_SOURCES, "model_builder.py", _NO_TOOLS_TEMPLATE_FILE)


def chat_template_without_tools() -> str:
    """Return the bundled ChatML template that ignores tools (like SmolLM2-Instruct's)."""
    return (
        resources.files("langchain_ascend.testing")
        .joinpath(_NO_TOOLS_TEMPLATE_FILE)
        .read_text(encoding="utf-8")
    )


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a test model; the same shape is used for every architecture.

    Attributes:
        vocab_size: Tokens in the model and its tokenizer (``len(tokenizer)``).
        hidden_size: Width of the residual stream.
        intermediate_size: Width of the MLP.
        num_hidden_layers: Decoder layers.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads (fewer than query heads: grouped-query attention).
        head_dim: Width of one attention head.
        max_position_embeddings: Longest context the model accepts.
        rope_theta: RoPE base frequency.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 1_000_000.0


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
    ),
    "bench": ModelPreset(
        vocab_size=32768,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
    ),
}


def _check_choice(kind: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(valid)}")


def _token_id(tokenizer_dir: Path, content: str) -> int:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        if token["content"] == content:
            return int(token["id"])
    raise RuntimeError(f"token {content!r} missing from {tokenizer_dir}")


def make_config(preset: str, arch: str, *, endoftext_id: int, im_end_id: int) -> Any:
    """Return the transformers config for ``arch`` shaped by preset ``preset``.

    Args:
        preset: A key of :data:`PRESETS`.
        arch: One of :data:`ALL_ARCHITECTURES`.
        endoftext_id: Id of ``<|endoftext|>`` (BOS and padding, as in Qwen2.5).
        im_end_id: Id of ``<|im_end|>`` (EOS of chat turns).

    Raises:
        ValueError: If ``preset`` or ``arch`` is unknown.
    """
    _check_choice("preset", preset, tuple(PRESETS))
    _check_choice("arch", arch, ALL_ARCHITECTURES)
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    family = families.by_architecture(arch)
    assert family is not None
    shape = asdict(PRESETS[preset])
    rope_theta = shape.pop("rope_theta")
    common: dict[str, Any] = dict(
        **shape,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=family.tied_test_head,
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
        use_cache=True,
    )
    if arch not in ARCHITECTURES:
        return _other_config(arch, common)
    common["hidden_act"] = "silu"
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False, attention_dropout=0.0)
    if arch == "qwen3":
        return Qwen3Config(
            **common, use_sliding_window=False, attention_bias=False, attention_dropout=0.0
        )
    return LlamaConfig(**common, attention_bias=False, mlp_bias=False, attention_dropout=0.0)


def _other_config(arch: str, common: dict[str, Any]) -> Any:
    """The config of gemma3, gemma2 or phi3, shaped as
    ``common`` says, with the values a GGUF file of it gives back (transformers' GGUF loader
    reads no ``query_pre_attn_scalar``, soft-capping or layer pattern: their defaults)."""
    from transformers import Gemma2Config, Gemma3TextConfig, Phi3Config

    if arch == "phi3":
        common.pop("head_dim")  # Phi-3: hidden_size / num_attention_heads
        return Phi3Config(**common, hidden_act="silu", attention_dropout=0.0,
                          original_max_position_embeddings=common["max_position_embeddings"])
    rope_theta = common.pop("rope_parameters")["rope_theta"]
    gemma = dict(common, hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                 attention_dropout=0.0, sliding_window=GEMMA_SLIDING_WINDOW)
    if arch == "gemma2":
        return Gemma2Config(**gemma, rope_parameters={"rope_type": "default",
                                                      "rope_theta": rope_theta})
    gemma["num_hidden_layers"] = max(_GEMMA3_LAYERS, gemma["num_hidden_layers"])
    return Gemma3TextConfig(**gemma, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": rope_theta},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})


def rescale_linear_weights(model: Any) -> None:
    """Redraw every linear layer but the output head from ``N(0, 1 / in_features)``.

    With ``from_config``'s ``N(0, 0.02)`` everywhere, each block's output is tiny next to the
    token embedding in the residual stream; a tied head then scores the input token (or one
    attractor token) highest and greedy decoding repeats it forever. Fan-in scaled weights
    let the blocks dominate, so random models produce varied text. Uses the current torch RNG.
    """
    import torch

    output_head = model.get_output_embeddings()
    with torch.no_grad():
        for _, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and module is not output_head:
                module.weight.normal_(mean=0.0, std=module.in_features**-0.5)


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def create_model(config: Any, *, seed: int) -> Any:
    """Instantiate a float32 random-weight model from ``config``, deterministically from ``seed``.

    Seeds torch, calls ``AutoModelForCausalLM.from_config`` and :func:`rescale_linear_weights`,
    then restores the caller's global RNG state.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        rescale_linear_weights(model)
    return model


def _write_model(
    out_dir: Path, preset: str, arch: str, seed: int, tokenizer_dir: Path, chat_template: str
) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    endoftext_id = _token_id(tokenizer_dir, ENDOFTEXT)
    im_end_id = _token_id(tokenizer_dir, IM_END)
    config = make_config(preset, arch, endoftext_id=endoftext_id, im_end_id=im_end_id)
    model = create_model(config, seed=seed)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id,
        eos_token_id=[im_end_id, endoftext_id],
        pad_token_id=endoftext_id,
    )
    with _quiet_progress_bars():
        model.save_pretrained(out_dir)
    for path in tokenizer_files(tokenizer_dir):
        shutil.copy2(path, out_dir / path.name)
    if chat_template == "no_tools":
        tokenizer = AutoTokenizer.from_pretrained(out_dir)
        tokenizer.chat_template = chat_template_without_tools()
        tokenizer.save_pretrained(out_dir)


def build_model(
    preset: str = "tiny",
    arch: str = "qwen2",
    *,
    seed: int = 0,
    chat_template: str = "tools",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Build (once) and cache a random-weight model with its tokenizer.

    Args:
        preset: A key of :data:`PRESETS` (``"tiny"`` or ``"bench"``).
        arch: One of :data:`ALL_ARCHITECTURES` (``"qwen2"``, ``"llama"``, ``"qwen3"``,
            ``"gemma2"``, ``"gemma3"``, ``"phi3"``).
        seed: Seed of the weight initialisation; same seed, same weights.
        chat_template: One of :data:`CHAT_TEMPLATES`: ``"tools"`` (Qwen2.5-style, renders
            tools) or ``"no_tools"`` (ChatML that ignores tools, like SmolLM2's). Same weights
            either way; a separate cache folder.
        cache_dir: Cache folder; defaults to ``models/`` of the package's cache root
            (``$LANGCHAIN_ASCEND_CACHE``, else ``$XDG_CACHE_HOME/langchain_ascend`` or
            ``~/.cache/langchain_ascend``).

    Returns:
        Folder loadable with both ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.

    Raises:
        ValueError: If ``preset``, ``arch`` or ``chat_template`` is unknown.
    """
    _check_choice("preset", preset, tuple(PRESETS))
    _check_choice("arch", arch, ALL_ARCHITECTURES)
    _check_choice("chat_template", chat_template, CHAT_TEMPLATES)
    root = resolve_cache_dir(cache_dir)
    tokenizer_dir = build_tokenizer(PRESETS[preset].vocab_size, cache_dir=root)
    fingerprint = builder_fingerprint(
        _MODEL_SOURCES, "model", preset, arch, seed, PRESETS[preset], tokenizer_dir.name,
        chat_template, families.by_architecture(arch),
    )
    variant = "" if chat_template == "tools" else f"-{chat_template.replace('_', '-')}"
    final_dir = root / f"{arch}-{preset}-seed{seed}{variant}-{fingerprint}"
    return build_once(
        final_dir,
        lambda out_dir: _write_model(out_dir, preset, arch, seed, tokenizer_dir, chat_template),
    )
