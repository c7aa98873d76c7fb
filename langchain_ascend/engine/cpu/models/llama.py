"""The owned CPU model of the Llama-style families: Llama, Mistral, Qwen2, Qwen3, Phi-3.

One layer, for ``T`` packed rows of a step (hidden ``D``, ``H`` query and ``KVH`` key/value
heads of width ``Dh``, MLP width ``I``)::

    x (T, D)
    h = rms_norm(x, input_norm)                         (T, D)
    q, k, v = split(qkv(h))                             (T, H*Dh), (T, KVH*Dh) x2  [Qwen2: + bias]
    q, k = rms_norm(q, q_norm), rms_norm(k, k_norm)     per head                   [Qwen3 only]
    q, k = rope(q, k); cache[slots] = k, v              one native call
    x = x + o(attention(q, paged cache))                (T, D)   [Mistral: sliding window]
    h = rms_norm(x, post_attention_norm)
    x = x + down(silu(gate(h)) * up(h))                 gate/up one product (T, 2I)

Phi-3 is this layer with q/k/v and gate/up already one weight each in transformers' modules
(``qkv_proj``, ``gate_up_proj``; the GGUF's ``attn_qkv`` / ``ffn_up``): the model takes those
products as they are instead of fusing siblings.

then the final norm and the LM head on the rows that sample. :class:`LlamaModel` holds every
weight as a plain attribute (norm vectors, the fused products -- GGUF blocks, int8/int4 blocks
or float tiles -- the rotary inverse frequencies, the embedding and the head) and runs EVERY
step of the CPU backend's paged path: a pure-decode step, or a step that is one prefill
segment (a chat turn, a tool result), of at most the stack's rows in one native call over all
layers (``engine.cpu.packed_layers``, ``native/decode_stack.c``), any other step (prefills of
several requests, mixed steps, longer prefills) layer by layer through the same kernels
(``engine.cpu.models.ops``). The two compute a row with the same kernels in the same order, so
a row's bits do not depend on what shared its step (tested).

:meth:`LlamaModel.build` takes the weights of a loaded model of one of these families once
(after ``engine.cpu.prepare`` fused and laid out its products): a transformers model, or, for a
GGUF file, the weight tree ``engine.cpu.models.llama_weights`` filled without any transformers
modeling code; from then on the tree's modules are not called on this path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import families
from langchain_ascend.engine.cpu.fused_projections import FusedProjections, group_of
from langchain_ascend.engine.cpu.models import ops
from langchain_ascend.engine.cpu.models.llama_weights import Decoder, Norm
from langchain_ascend.engine.cpu.packed_layers import PackedLayers
from langchain_ascend.engine.cpu.quantized_layout import is_quantized_product
from langchain_ascend.native import rms_norm as native_rms_norm
from langchain_ascend.native import rope_kv

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

NORM_CLASSES = families.owned_classes("llama", "RMSNorm")
"""transformers' RMSNorm classes of these families: ``weight * x * rsqrt(mean(x^2) + eps)``."""
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""Rotary scalings whose frequencies do not depend on the step's positions (``dynamic`` and
Phi-3's ``longrope`` switch frequencies with the sequence length: transformers' forward runs
those)."""


@dataclass
class LlamaLayer:
    """One decoder layer's weights (module docstring), each a plain attribute.

    Attributes:
        index: The layer's position (its paged cache).
        input_norm, post_attention_norm: ``(D,)`` RMSNorm weights; ``eps``, ``post_eps``
            theirs.
        qkv: The fused q/k/v product (``forward(x (M, D)) -> (M, (H + 2 KVH) Dh)``).
        o: The output projection ``(M, H Dh) -> (M, D)``.
        gate_up: The fused gate/up product ``(M, D) -> (M, 2I)``.
        down: ``(M, I) -> (M, D)``.
        q_norm, k_norm: Qwen3's ``(Dh,)`` per-head norms (None elsewhere); ``head_eps``.
        window: The attention's sliding window (Mistral; Qwen2's sliding layers), or None.
        native_silu: The MLP takes the stack's SiLU code (quantized products).
    """

    index: int
    input_norm: Any
    post_attention_norm: Any
    eps: float
    post_eps: float
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    q_norm: Any = None
    k_norm: Any = None
    head_eps: float = 0.0
    window: int | None = None
    native_silu: bool = False

    @property
    def intermediate(self) -> int:
        """The MLP's width ``I`` (half the gate/up product's outputs)."""
        return int(self.down.in_features)


class LlamaModel:
    """A Llama-style model's CPU forward over its own weights (module docstring).

    Attributes:
        embed_tokens: The token embedding (``(1, T) -> (1, T, D)``: float or quantized rows).
        inv_freq: ``(Dh/2,)`` rotary inverse frequencies (rope scaling applied);
            ``rope_scaling``: the rope's attention factor; ``rotary``: their
            :class:`~.ops.RotaryTable`.
        layers: One :class:`LlamaLayer` per decoder layer.
        norm, norm_eps: The final RMSNorm.
        head: The LM head (``(..., D) -> (..., V)``).
        heads, kv_heads, head_dim, intermediate: The geometry.
        scale: The attention's softmax scale.
        dtype: The activations' dtype (float32 or bfloat16).
        stack: The native decode stack over :attr:`layers`, or None where a product has no
            layout it reads (every step then runs per op).
    """

    def __init__(self, *, embed_tokens: Any, inv_freq: Any, rope_scaling: float,
                 layers: list[LlamaLayer], norm: Any, norm_eps: float, head: Any,
                 heads: int, kv_heads: int, head_dim: int, intermediate: int, scale: float,
                 dtype: Any, stack: PackedLayers | None) -> None:
        self.embed_tokens = embed_tokens
        self.inv_freq = inv_freq
        self.rope_scaling = rope_scaling
        self.rotary = ops.RotaryTable(inv_freq, rope_scaling, dtype)
        self.layers = layers
        self.norm = norm
        self.norm_eps = norm_eps
        self.head = head
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim, self.intermediate = head_dim, intermediate
        self.scale = scale
        self.dtype = dtype
        self.stack = stack

    @staticmethod
    def owns(model: Any) -> bool:
        """Whether ``model`` is a transformers model of these families, or their weight tree
        (``llama_weights.LlamaWeights``)."""
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        return (decoder is not None and model_type in families.owned_model_types("llama")
                and (isinstance(decoder, Decoder)
                     or type(decoder).__name__ in families.owned_classes("llama")))

    @classmethod
    def build(cls, model: Any, groups: list[FusedProjections]) -> LlamaModel | None:
        """The owned model of a prepared transformers ``model`` of these families whose
        sibling projections were fused into ``groups`` (``engine.cpu.fused_projections``), or
        None where it does not apply (another family, a product not fused or laid out for our
        kernels, a dtype the native kernels do not take); logs why."""
        import torch

        config = getattr(model, "config", None)
        if not cls.owns(model):
            return None
        decoder = model.get_decoder()
        dtype = next(model.parameters()).dtype
        if (dtype not in (torch.float32, torch.bfloat16) or not rope_kv.available(dtype)
                or (dtype == torch.bfloat16 and not native_rms_norm.available())):
            logger.info("no owned CPU model for %s weights here", dtype)
            return None
        layers = [_layer(module, index, groups) for index, module in enumerate(decoder.layers)]
        if any(layer is None for layer in layers) or len(layers) != config.num_hidden_layers:
            logger.info("no owned CPU model: a layer's products are not fused for our kernels")
            return None
        owned = [layer for layer in layers if layer is not None]
        attention = decoder.layers[0].self_attn
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim, intermediate = attention.head_dim, owned[0].intermediate
        rotary = decoder.rotary_emb
        reason = rotary_refusal(rotary, head_dim)
        if reason is not None:
            logger.info("no owned CPU model: %s", reason)
            return None
        stack = PackedLayers.for_layers(owned, dtype=dtype, geometry=(
            heads, kv_heads, head_dim, intermediate), scale=attention.scaling)
        logger.info("owned CPU model over %d layers (%s)", len(owned),
                    "no native decode stack: a product has no layout it reads" if stack is None
                    else f"decode stack up to {stack.max_rows} rows")
        return cls(embed_tokens=decoder.embed_tokens, inv_freq=rotary.inv_freq,
                   rope_scaling=float(rotary.attention_scaling), layers=owned,
                   norm=decoder.norm.weight, norm_eps=float(decoder.norm.variance_epsilon),
                   head=model.get_output_embeddings(), heads=heads, kv_heads=kv_heads,
                   head_dim=head_dim, intermediate=intermediate, scale=attention.scaling,
                   dtype=dtype, stack=stack)

    @property
    def num_layers(self) -> int:
        """How many layers it runs."""
        return len(self.layers)

    def can_run(self, input_ids: torch.Tensor, step: Any) -> bool:
        """Whether this model runs the step of ``input_ids`` ``(1, T)``: any step of the CPU
        backend's paged path (other backends' steps run transformers' forward)."""
        return ops.runs_step(input_ids, step, self.dtype)

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
               step: Any) -> torch.Tensor:
        """``(1, T, D)`` final-normed hidden states of the step (``input_ids``,
        ``position_ids`` ``(1, T)``), writing every layer's K/V."""
        x = self.embed_tokens(input_ids)[0].contiguous()  # (T, D)
        cos, sin = self.rotary(position_ids[0])  # (T, Dh) each
        tables = None if self.stack is None else self.stack.step_tables(step, input_ids)
        if tables is not None:
            self.stack.run(x, cos, sin, step, tables)  # every layer in one native call
        else:
            for layer in self.layers:
                x = self._layer(layer, x, cos, sin, step)
        return ops.rms_norm(x, self.norm, self.norm_eps)[None]  # (1, T, D)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(S, V)`` logits of the ``rows`` ``(S,)`` of ``hidden`` ``(1, T, D)``."""
        return self.head(hidden[:, rows])[0]  # (S, V)

    def _layer(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, step: Any) -> torch.Tensor:
        """One layer on ``x`` ``(T, D)`` (module docstring's pseudo-code)."""
        tokens, dim = x.shape[0], self.head_dim
        h = ops.rms_norm(x, layer.input_norm, layer.eps)  # (T, D)
        q, k, v = layer.qkv.forward(h).split(
            [self.heads * dim, self.kv_heads * dim, self.kv_heads * dim], dim=-1)
        q = q.view(tokens, self.heads, dim)  # (T, H, Dh)
        k = k.view(tokens, self.kv_heads, dim)  # (T, KVH, Dh)
        v = v.view(tokens, self.kv_heads, dim)  # (T, KVH, Dh)
        if layer.q_norm is not None:
            q = ops.rms_norm(q, layer.q_norm, layer.head_eps)
            k = ops.rms_norm(k, layer.k_norm, layer.head_eps)  # contiguous (T, KVH, Dh)
            v = v.contiguous()  # the rotary kernel reads k and v with one token stride
        out = ops.attend(q, k, v, cos, sin, step, layer.index, self.scale,
                         layer.window)  # (T, H, Dh)
        x = x + layer.o.forward(out.reshape(tokens, -1))  # (T, D)
        h = ops.rms_norm(x, layer.post_attention_norm, layer.post_eps)
        return x + ops.mlp(h, layer.gate_up, layer.down, self.intermediate, layer.native_silu)


def rotary_refusal(rotary: Any, head_dim: int, inv_freq: Any = None) -> str | None:
    """Why the owned models cannot rotate with transformers' rotary module ``rotary`` (its
    ``inv_freq``, or the given one) at head width ``head_dim``, or None where they can: the
    rotary kernel takes widths in multiples of 16, rotates the whole head (no partial rotary),
    and the frequencies must not change with the sequence (:data:`STATIC_ROPE_TYPES`)."""
    inv_freq = rotary.inv_freq if inv_freq is None else inv_freq
    rope_types = getattr(rotary, "rope_type", "default")
    rope_types = rope_types.values() if isinstance(rope_types, dict) else [rope_types]
    if head_dim % 16:
        return f"head width {head_dim} (the rotary kernel takes multiples of 16)"
    if 2 * inv_freq.numel() != head_dim:
        return f"a partial rotary ({2 * inv_freq.numel()} of {head_dim} dims)"
    moving = [t for t in rope_types if t not in STATIC_ROPE_TYPES]
    if moving:
        return f"rotary scaling {moving[0]!r} (its frequencies follow the sequence length)"
    return None


def _sliding_window(attention: Any) -> int | None:
    """The window transformers' attention module passes to its attention function."""
    if type(attention).__name__ in ("MistralAttention", "Phi3Attention"):
        return getattr(attention.config, "sliding_window", None)
    return getattr(attention, "sliding_window", None)


def _product(groups: list[FusedProjections], module: Any, fused: str,
             members: tuple[str, ...]) -> Any:
    """The one product of ``module``'s ``members`` (``("q_proj", "k_proj", "v_proj")``): the
    fused group of them, or the module's own ``fused`` linear where transformers keeps them as
    one weight (Phi-3's ``qkv_proj``); None where neither is there."""
    own = getattr(module, fused, None)
    if own is not None:
        return own
    group = group_of(groups, [getattr(module, name, None) for name in members])
    return None if group is None else group.linear


def _norm(module: Any) -> tuple[Any, float] | None:
    """``(weight, eps)`` of a transformers RMSNorm of these families (or the weight tree's
    ``Norm``), or None."""
    if (not isinstance(module, Norm) and type(module).__name__ not in NORM_CLASSES
            or getattr(module, "weight", None) is None):
        return None
    eps = getattr(module, "variance_epsilon", None)
    return (module.weight.detach(), float(eps)) if isinstance(eps, float) else None


def _layer(module: Any, index: int, groups: list[FusedProjections]) -> LlamaLayer | None:
    """The weights of transformers' decoder layer ``module``, or None where its products are
    not fused groups (``engine.cpu.fused_projections``) or fused weights (Phi-3), or its MLP
    is not ``silu``."""
    attention, mlp = module.self_attn, module.mlp
    qkv = _product(groups, attention, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
    gate_up = _product(groups, mlp, "gate_up_proj", ("gate_proj", "up_proj"))
    norms = [_norm(module.input_layernorm), _norm(module.post_attention_layernorm)]
    if (qkv is None or gate_up is None or None in norms
            or gate_up.out_features != 2 * mlp.down_proj.in_features
            or getattr(mlp.config, "hidden_act", None) != "silu"):
        return None
    (norm1, eps), (norm2, post_eps) = norms  # type: ignore[misc]
    head_norms = [None, None]
    head_eps = 0.0
    if hasattr(attention, "q_norm"):  # Qwen3
        found = [_norm(attention.q_norm), _norm(attention.k_norm)]
        if None in found:
            return None
        (q_w, head_eps), (k_w, _) = found  # type: ignore[misc]
        head_norms = [q_w, k_w]
    return LlamaLayer(index=index, input_norm=norm1, post_attention_norm=norm2, eps=eps,
                      post_eps=post_eps, qkv=qkv, o=attention.o_proj, gate_up=gate_up,
                      down=mlp.down_proj, q_norm=head_norms[0], k_norm=head_norms[1],
                      head_eps=head_eps, window=_sliding_window(attention),
                      native_silu=is_quantized_product(gate_up))
