"""The weight tree of an owned Llama-style model loaded from a GGUF file: no transformers code.

Loading a GGUF file through transformers' model classes costs more than the load itself on a
CPU: importing the family's config and modeling modules pulls in about two thousand modules
(1.5-2.5 s, ``benchmarks/load_stages.py``) before a byte is read. The owned CPU model
(``engine.cpu.models.llama``) never calls those modules, so for it the GGUF loader
(``quant.gguf_model``) fills this tree instead: plain ``nn.Module`` containers with
transformers' parameter names (so the file's tensor-name table, the projection fusing and the
weight layouts apply unchanged) and no ``forward`` of their own. :class:`LlamaWeights` is the
causal LM's; its config is a plain ``PretrainedConfig`` read from the folder's
``config.json``.

It covers what the owned model runs: Llama (Mistral in GGUF), Qwen2 (q/k/v biases) and Qwen3
(per-head q/k norms), with the default, linear or Llama-3 rotary frequencies
(:func:`inv_freq`: transformers' formulas, the same float32 ops). Anything else --
another family or rope type, another device -- is built by transformers, as before
(:func:`applies`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

from langchain_ascend import platform
from langchain_ascend.engine.model_source.gguf_blocks import gguf_weights_file
from langchain_ascend.errors import ModelSourceError
from langchain_ascend.native import matvec, rope_kv, stack_kernel
from langchain_ascend.native import rms_norm as native_rms_norm


class OwnedModelUnavailable(ModelSourceError):
    """The owned CPU model cannot run a model loaded into this tree (the loader then builds
    transformers' model class instead)."""


OWNED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
"""``model_type`` values this tree holds (llama.cpp's ``general.architecture`` too)."""
ROPE_TYPES = ("default", "linear", "llama3")
"""Rotary scalings :func:`inv_freq` computes."""


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's rotary parameters (transformers 5's ``rope_parameters``, or the older
    ``rope_theta`` / ``rope_scaling`` fields), with ``rope_type`` filled in."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def applies(config: Any) -> bool:
    """Whether this tree holds a model of ``config`` that the owned model runs (family, rotary
    scaling, SiLU, a head width the rotary kernel takes)."""
    return (getattr(config, "model_type", None) in OWNED_ARCHITECTURES
            and rope_parameters(config)["rope_type"] in ROPE_TYPES
            and getattr(config, "hidden_act", "silu") == "silu"
            and head_dim_of(config) % 16 == 0)


def folder_config(path: str | os.PathLike[str]) -> Any:
    """The config of a GGUF-backed model folder (``engine.model_source.gguf_blocks``) whose
    model this tree holds (:func:`applies`), as a plain ``PretrainedConfig`` read from its
    ``config.json``; None for any other folder (transformers' config class reads those)."""
    from transformers import PretrainedConfig

    if gguf_weights_file(path) is None:
        return None
    try:
        with open(os.path.join(os.fspath(path), "config.json"), encoding="utf-8") as handle:
            fields = json.load(handle)
    except (OSError, ValueError):
        return None
    config = PretrainedConfig(**fields)
    return config if applies(config) else None


def owned_gguf_config(path: str | os.PathLike[str], *, device: Any, dtype: torch.dtype,
                      attention_backend: str, weight_layout: str, compile: Any) -> Any:
    """:func:`folder_config` where the owned CPU model will run every step of the model at
    ``path`` with these settings (the CPU and its attention backend, the ``"dual"`` layout,
    eager decode steps, a dtype and kernels the owned model takes), else None: transformers'
    model class is built, as for any other model."""
    if (platform.device_type(device) != "cpu" or attention_backend not in ("auto", "cpu")
            or weight_layout not in ("auto", "dual") or compile not in ("auto", False)
            or dtype not in (torch.float32, torch.bfloat16)
            or not stack_kernel.available() or not rope_kv.available(dtype)):
        return None
    if dtype == torch.bfloat16 and not (native_rms_norm.available()
                                        and matvec.bf16_available()):
        return None
    return folder_config(path)


def head_dim_of(config: Any) -> int:
    """The attention head width (``head_dim``, else ``hidden_size / heads``)."""
    return int(getattr(config, "head_dim", None)
               or config.hidden_size // config.num_attention_heads)


def inv_freq(config: Any) -> torch.Tensor:
    """``(Dh/2,)`` float32 rotary inverse frequencies of ``config``, as transformers computes
    them (``1 / theta^(2i / Dh)``; linear: divided by the factor; Llama 3: low frequencies
    divided by the factor, high ones kept, a smooth blend between)."""
    params = rope_parameters(config)
    dim = head_dim_of(config)
    base = float(params["rope_theta"])
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    kind = params["rope_type"]
    if kind == "linear":
        return freq / float(params["factor"])
    if kind != "llama3":
        return freq
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


class Norm(torch.nn.Module):
    """An RMSNorm's weight ``(D,)`` and epsilon."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)
        self.variance_epsilon = float(eps)


class Rotary(torch.nn.Module):
    """The rotary inverse frequencies (a real buffer: computed, not read) and the rope's
    attention factor (1 for the scalings covered)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq(config), persistent=False)
        self.attention_scaling = 1.0


class MetaLinear(torch.nn.Linear):
    """An ``nn.Linear`` on the meta device whose weights are never initialised: the file
    gives them (initialising meta tensors imports torch's decompositions, ~1.5 s)."""

    def reset_parameters(self) -> None:
        pass


class MetaEmbedding(torch.nn.Embedding):
    """An ``nn.Embedding`` on the meta device, never initialised (as :class:`MetaLinear`)."""

    def reset_parameters(self) -> None:
        pass


def _linear(rows: int, cols: int, bias: bool) -> torch.nn.Linear:
    return MetaLinear(cols, rows, bias=bias, device="meta")


class Attention(torch.nn.Module):
    """q/k/v/o projections (Qwen2: q/k/v biases; Qwen3: per-head norms) and the geometry."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        dim, heads, kv_heads = (head_dim_of(config), config.num_attention_heads,
                                config.num_key_value_heads)
        bias = bool(getattr(config, "attention_bias", config.model_type == "qwen2"))
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = dim
        self.scaling = dim ** -0.5
        self.sliding_window = sliding_window(config, layer_idx)
        self.q_proj = _linear(heads * dim, config.hidden_size, bias)
        self.k_proj = _linear(kv_heads * dim, config.hidden_size, bias)
        self.v_proj = _linear(kv_heads * dim, config.hidden_size, bias)
        self.o_proj = _linear(config.hidden_size, heads * dim, False)
        if config.model_type == "qwen3":
            self.q_norm = Norm(dim, config.rms_norm_eps)
            self.k_norm = Norm(dim, config.rms_norm_eps)


class MLP(torch.nn.Module):
    """gate/up/down projections of a SiLU MLP."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.config = config
        self.gate_proj = _linear(config.intermediate_size, config.hidden_size, bias)
        self.up_proj = _linear(config.intermediate_size, config.hidden_size, bias)
        self.down_proj = _linear(config.hidden_size, config.intermediate_size, bias)


class Layer(torch.nn.Module):
    """One decoder layer's weights."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = Norm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = Norm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Decoder(torch.nn.Module):
    """The embedding, the layers, the final norm and the rotary frequencies."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = MetaEmbedding(config.vocab_size, config.hidden_size,
                                          device="meta")
        self.layers = torch.nn.ModuleList(Layer(config, index)
                                          for index in range(config.num_hidden_layers))
        self.norm = Norm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Rotary(config)


class LlamaWeights(torch.nn.Module):
    """A Llama-style causal LM's weights under transformers' names (module docstring); every
    parameter on the meta device until the GGUF loader fills it."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = _linear(config.vocab_size, config.hidden_size, False)

    def get_decoder(self) -> Decoder:
        return self.model

    def get_input_embeddings(self) -> Any:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> Any:
        return self.lm_head

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: this tree only holds weights; the owned CPU model runs it."""
        raise RuntimeError("a GGUF model loaded for the owned CPU model runs only through it "
                           "(engine.cpu.models.llama); load it with device='cpu' and the CPU "
                           "attention backend")


def sliding_window(config: Any, layer_idx: int) -> int | None:
    """The window of layer ``layer_idx`` (Qwen2/Qwen3 ``layer_types``), or None."""
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if not window or not getattr(config, "use_sliding_window", False) or not layer_types:
        return None
    return int(window) if layer_types[layer_idx] == "sliding_attention" else None
