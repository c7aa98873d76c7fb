"""Small GGUF files written from the tiny random models, as llama.cpp's converter lays them out.

:func:`write_gguf` takes a tiny HF folder (:func:`~langchain_ascend.testing.build_model`, any
family) and writes its weights with ``gguf.GGUFWriter``: llama.cpp's tensor names (this
module's own table per family, written from llama.cpp's converter, not from the loader's
mapping), the Llama q/k rows reordered for llama.cpp's rotary layout (per head, the halves
interleaved), Gemma's norm weights stored plus one (llama.cpp's ``norm_shift``), Phi-3's fused
``qkv_proj`` / ``gate_up_proj`` as its ``attn_qkv`` / ``ffn_up``, linear weights in the asked
ggml type (quantized with ``gguf.quants.quantize``; the types gguf-py cannot quantize --
``Q2_K`` ... ``Q6_K`` -- as random blocks of about the model's weight size, see
:data:`RANDOM_BLOCK_SCALES`), norms in F32, the family's metadata and
the tokenizer (vocabulary, merges, special ids, chat template) so transformers can load the
file too. Deterministic: the same folder gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from langchain_ascend.testing.random_blocks import random_block_bytes

_COMMON_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
_GEMMA_NAMES = {
    **_COMMON_NAMES, "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
}
LLAMA_CPP_NAMES: dict[str, dict[str, str]] = {
    "llama": {**_COMMON_NAMES, "post_attention_layernorm": "ffn_norm"},
    "qwen2": {**_COMMON_NAMES, "post_attention_layernorm": "ffn_norm"},
    "qwen3": {**_COMMON_NAMES, "post_attention_layernorm": "ffn_norm"},
    "phi3": {**_COMMON_NAMES, "post_attention_layernorm": "ffn_norm",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "gemma2": _GEMMA_NAMES,
    "gemma3": _GEMMA_NAMES,
}
RANDOM_BLOCK_SCALES = {"Q4_K": 5e-5, "Q5_K": 2.5e-5, "Q6_K": 2e-5, "Q3_K": 2e-3, "Q2_K": 2e-3}
"""Largest half-float super-scale of the random blocks written per type (the types gguf-py
cannot quantize), so that the weights come out of about the size of the model's own
(``|w| ~ 0.02``)."""
"""Per GGUF architecture: the HF module path inside a layer -> llama.cpp's tensor name."""
_GEMMA_ARCHITECTURES = ("gemma2", "gemma3")


def llama_cpp_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order: each head's rows ``[first half, second half]``
    become ``[h0[0], h1[0], h0[1], h1[1], ...]`` (written independently of the loader's
    inverse, from the converter's definition)."""
    rows = weight.shape[0]
    grouped = weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def gguf_architecture(model_type: str) -> str:
    """llama.cpp's ``general.architecture`` of a transformers ``model_type``."""
    return "gemma3" if model_type == "gemma3_text" else model_type


def gguf_name(hf_name: str, architecture: str) -> str | None:
    """llama.cpp's name of the HF parameter ``hf_name``, or None (not written)."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    short = LLAMA_CPP_NAMES[architecture].get(module)
    return None if short is None else f"blk.{layer}.{short}.{suffix}"


def _stored_values(name: str, values: np.ndarray, arch: str, config: Any) -> np.ndarray:
    """``values`` as llama.cpp's converter stores the tensor ``name``."""
    if arch == "llama" and ".attn_q." in name:
        return llama_cpp_rows(values, config.num_attention_heads)
    if arch == "llama" and ".attn_k." in name:
        return llama_cpp_rows(values, config.num_key_value_heads)
    if arch in _GEMMA_ARCHITECTURES and name.endswith("norm.weight"):
        return values + np.float32(1.0)  # Gemma's (1 + w) RMSNorm: llama.cpp stores 1 + w
    return values


def _add_metadata(writer: Any, config: Any, arch: str) -> None:
    """The hyperparameters llama.cpp's converter writes for ``arch``."""
    head_dim = int(getattr(config, "head_dim", None)
                   or config.hidden_size // config.num_attention_heads)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma 3: one table per layer type
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", *_GEMMA_ARCHITECTURES):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch in _GEMMA_ARCHITECTURES:
        writer.add_sliding_window(int(config.sliding_window))
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping))
        writer.add_final_logit_softcapping(float(config.final_logit_softcapping))
    writer.add_vocab_size(config.vocab_size)


def write_gguf(model_dir: Path, out: Path, *, linear_type: str = "Q4_1",
               embed_type: str = "Q8_0", tie: bool | None = None,
               types: dict[str, str] | None = None) -> Path:
    """Write the model in ``model_dir`` as a GGUF file ``out``.

    Args:
        model_dir: A tiny HF folder (weights, config, tokenizer) of any family.
        out: The file to write.
        linear_type: ggml type name of every linear weight (``"Q4_1"``, ``"Q6_K"``, ``"F32"``).
        embed_type: ggml type of the token embedding (and of ``output.weight``).
        tie: Leave ``output.weight`` out (a tied head); default: as the model's config says.
        types: Per-GGUF-name overrides of the type (``{"blk.0.ffn_down.weight": "Q8_0"}``).

    Returns:
        ``out``.
    """
    import gguf
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    tie = bool(config.tie_word_embeddings) if tie is None else tie
    state = load_file(str(model_dir / "model.safetensors"))
    arch = gguf_architecture(config.model_type)
    writer = gguf.GGUFWriter(str(out), arch)
    _add_metadata(writer, config, arch)
    _add_tokenizer(writer, model_dir, config.vocab_size)
    for hf_name, tensor in state.items():
        name = gguf_name(hf_name, arch)
        if name is None or (tie and name == "output.weight"):
            continue
        values = _stored_values(name, tensor.to(torch.float32).numpy(), arch, config)
        if values.ndim == 1:
            kind = "F32"
        elif name in ("token_embd.weight", "output.weight"):
            kind = embed_type
        else:
            kind = linear_type
        kind = (types or {}).get(name, kind)
        qtype = gguf.GGMLQuantizationType[kind]
        if kind in RANDOM_BLOCK_SCALES:
            seed = sum(name.encode())
            blocks = random_block_bytes(kind, *values.shape, seed=seed,
                                        scale=RANDOM_BLOCK_SCALES[kind])
            writer.add_tensor(name, blocks.numpy(), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(values))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, np.ascontiguousarray(values.astype(np.float16)))
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_tokenizer(writer: Any, model_dir: Path, vocab_size: int) -> None:
    """The byte-level BPE vocabulary as llama.cpp's ``gpt2`` tokenizer model."""
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    settings = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    added = {item["content"]: item["id"] for item in spec["added_tokens"]}
    tokens = [""] * vocab_size
    kinds = [1] * vocab_size
    for text, index in {**vocab, **added}.items():
        if index < vocab_size:
            tokens[index] = text
    for index in range(vocab_size):
        if not tokens[index]:
            tokens[index] = f"[PAD{index}]"
            kinds[index] = 5
    for index in added.values():
        kinds[index] = 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges(merges)
    eos = settings.get("eos_token")
    pad = settings.get("pad_token")
    if eos in added:
        writer.add_eos_token_id(added[eos])
    if pad in added:
        writer.add_pad_token_id(added[pad])
    writer.add_add_bos_token(False)
    template = settings.get("chat_template")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)
