"""The owned CPU model of Gemma 2 and Gemma 3 (text).

One layer, for ``T`` packed rows of a step (hidden ``D``, ``H`` query and ``KVH`` key/value
heads of width ``Dh``, MLP width ``I``); every norm is Gemma's RMSNorm,
``x * rsqrt(mean(x^2) + eps) * (1 + w)`` in float32, held here as the vector ``1 + w``::

    x (T, D)                                            embedding already times sqrt(D)
    h = norm(x, input_norm)                             (T, D)
    q, k, v = split(qkv(h))                             (T, H*Dh), (T, KVH*Dh) x2
    q, k = norm(q, q_norm), norm(k, k_norm)             per head                   [Gemma 3]
    q, k = rope(q, k); cache[slots] = k, v              the layer's own frequencies [Gemma 3:
                                                        local layers 10k, global layers theirs]
    a = attention(q, paged cache)                       scale query_pre_attn_scalar^-0.5,
                                                        sliding window on local layers,
                                                        scores soft-capped      [Gemma 2]
    x = x + norm(o(a), post_attention_norm)             (T, D)
    h = norm(x, pre_feedforward_norm)
    x = x + norm(down(gelu_tanh(gate(h)) * up(h)), post_feedforward_norm)

then the final norm, the LM head on the rows that sample, and Gemma 2's final logit soft-cap
``cap * tanh(logits / cap)``. The layer differs from the Llama-style one
(``engine.cpu.models.llama``) in its norms (four, ``1 + w``, after the sub-blocks too), its
activation and its per-layer rotary tables, so it is its own model over the same per-op
kernels (``engine.cpu.models.ops``: the fused q/k/v and gate/up products, the rotary-and-write
kernel, the CPU backend's paged attention with its soft-cap). Every step, prefill and decode,
runs layer by layer through them: the native decode stack is the Llama layer's only, so a
row's bits never depend on what shared its step here either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import families
from langchain_ascend.engine.cpu.fused_projections import FusedProjections, group_of
from langchain_ascend.engine.cpu.models import ops
from langchain_ascend.engine.cpu.models.llama import rotary_refusal
from langchain_ascend.native import rope_kv

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

NORM_CLASSES = families.owned_classes("gemma", "RMSNorm")
"""transformers' Gemma RMSNorm classes (``(1 + w)`` scaling, computed in float32)."""
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh"}
"""transformers' ``hidden_activation`` values this model computes -> ``ops.mlp``'s name."""


def gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm of ``x`` ``(..., D)`` with ``weight`` the float32 ``(D,)`` vector
    ``1 + w``: normalised and scaled in float32, cast back to ``x``'s dtype (transformers'
    order; float32 rows go through the native kernel)."""
    import torch
    import torch.nn.functional as F

    if x.dtype == torch.float32:
        return ops.rms_norm(x, weight, eps)
    return F.rms_norm(x.to(torch.float32), weight.shape, weight, eps).to(x.dtype)


@dataclass
class GemmaLayer:
    """One decoder layer's weights (module docstring), each a plain attribute.

    Attributes:
        index: The layer's position (its paged cache).
        input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm: ``(D,)``
            float32 ``1 + w`` vectors; ``eps`` theirs.
        qkv, o, gate_up, down: The products (``qkv``/``gate_up`` fused, gate rows first).
        q_norm, k_norm: Gemma 3's ``(Dh,)`` per-head ``1 + w`` (None for Gemma 2);
            ``head_eps`` theirs.
        window: The sliding window of a local layer, None on a global one.
        rope: Index of the layer's rotary frequencies in :attr:`GemmaModel.ropes`.
    """

    index: int
    input_norm: Any
    post_attention_norm: Any
    pre_feedforward_norm: Any
    post_feedforward_norm: Any
    eps: float
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    q_norm: Any = None
    k_norm: Any = None
    head_eps: float = 0.0
    window: int | None = None
    rope: int = 0


class GemmaModel:
    """Gemma 2/3's CPU forward over its own weights (module docstring).

    Attributes:
        embed_tokens: The scaled token embedding (``(1, T) -> (1, T, D)``).
        ropes: ``[(inv_freq (Dh/2,), attention scaling)]``: the distinct rotary frequencies
            of the layers (Gemma 3: local and global; Gemma 2: one); ``rotaries``: their
            :class:`~.ops.RotaryTable` s.
        layers: One :class:`GemmaLayer` per decoder layer.
        norm, norm_eps: The final norm (``1 + w``).
        head: The LM head; ``final_softcap``: Gemma 2's logit cap (None: none).
        heads, kv_heads, head_dim, intermediate: The geometry.
        scale: The attention's softmax scale; ``softcap``: its score cap (Gemma 2).
        activation: The MLP's activation (``ops.ACTIVATIONS``).
        dtype: The activations' dtype (float32 or bfloat16).
    """

    def __init__(self, *, embed_tokens: Any, ropes: list[tuple[Any, float]],
                 layers: list[GemmaLayer], norm: Any, norm_eps: float, head: Any,
                 final_softcap: float | None, heads: int, kv_heads: int, head_dim: int,
                 intermediate: int, scale: float, softcap: float | None, activation: str,
                 dtype: Any) -> None:
        self.embed_tokens = embed_tokens
        self.ropes = ropes
        self.rotaries = [ops.RotaryTable(inv_freq, scaling, dtype) for inv_freq, scaling in ropes]
        self.layers = layers
        self.norm, self.norm_eps = norm, norm_eps
        self.head, self.final_softcap = head, final_softcap
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim, self.intermediate = head_dim, intermediate
        self.scale, self.softcap = scale, softcap
        self.activation = activation
        self.dtype = dtype

    @staticmethod
    def owns(model: Any) -> bool:
        """Whether ``model`` is a transformers model of Gemma 2 or Gemma 3 (text)."""
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        return (decoder is not None and model_type in families.owned_model_types("gemma")
                and type(decoder).__name__ in families.owned_classes("gemma"))

    @classmethod
    def build(cls, model: Any, groups: list[FusedProjections]) -> GemmaModel | None:
        """The owned model of a prepared Gemma ``model`` whose q/k/v and gate/up projections
        were fused into ``groups``, or None where it does not apply (another family, an
        activation, rotary scaling or attention it does not compute, a dtype the rotary
        kernel does not take); logs why."""
        import torch

        config = getattr(model, "config", None)
        if not cls.owns(model):
            return None
        dtype = next(model.parameters()).dtype
        activation = ACTIVATIONS.get(getattr(config, "hidden_activation", None) or "")
        if activation is None or getattr(config, "use_bidirectional_attention", False):
            logger.info("no owned CPU model for this Gemma: activation %r, bidirectional %s",
                        getattr(config, "hidden_activation", None),
                        getattr(config, "use_bidirectional_attention", False))
            return None
        if dtype not in (torch.float32, torch.bfloat16) or not rope_kv.available(dtype):
            logger.info("no owned CPU model for %s weights here", dtype)
            return None
        decoder = model.get_decoder()
        attention = decoder.layers[0].self_attn
        head_dim = attention.head_dim
        ropes, rope_index = _ropes(decoder, config, head_dim)
        if ropes is None or len(rope_index) != len(decoder.layers):
            return None
        layers = [_layer(module, index, groups, rope_index[index])
                  for index, module in enumerate(decoder.layers)]
        if any(layer is None for layer in layers) or len(layers) != config.num_hidden_layers:
            logger.info("no owned CPU model: a Gemma layer's products are not fused or a "
                        "norm is not Gemma's")
            return None
        owned = [layer for layer in layers if layer is not None]
        final_norm = _norm(decoder.norm)
        if final_norm is None:
            return None
        logger.info("owned CPU model over %d Gemma layers (every step per op)", len(owned))
        return cls(embed_tokens=decoder.embed_tokens, ropes=ropes, layers=owned,
                   norm=final_norm[0], norm_eps=final_norm[1],
                   head=model.get_output_embeddings(),
                   final_softcap=getattr(config, "final_logit_softcapping", None),
                   heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                   head_dim=head_dim, intermediate=owned[0].down.in_features,
                   scale=float(attention.scaling),
                   softcap=getattr(attention, "attn_logit_softcapping", None),
                   activation=activation, dtype=dtype)

    @property
    def num_layers(self) -> int:
        """How many layers it runs."""
        return len(self.layers)

    def can_run(self, input_ids: torch.Tensor, step: Any) -> bool:
        """Whether this model runs the step of ``input_ids`` ``(1, T)``: any step of the CPU
        backend's paged path."""
        return ops.runs_step(input_ids, step, self.dtype)

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
               step: Any) -> torch.Tensor:
        """``(1, T, D)`` final-normed hidden states of the step (``input_ids``,
        ``position_ids`` ``(1, T)``), writing every layer's K/V."""
        x = self.embed_tokens(input_ids)[0].contiguous()  # (T, D)
        tables = [rotary(position_ids[0]) for rotary in self.rotaries]  # [(cos, sin) (T, Dh)]
        for layer in self.layers:
            x = self._layer(layer, x, *tables[layer.rope], step)
        return gemma_norm(x, self.norm, self.norm_eps)[None]  # (1, T, D)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(S, V)`` logits of the ``rows`` ``(S,)`` of ``hidden`` ``(1, T, D)``, soft-capped
        where the model caps them."""
        import torch

        logits = self.head(hidden[:, rows])[0]  # (S, V)
        if self.final_softcap is None:
            return logits
        return torch.tanh(logits / self.final_softcap) * self.final_softcap

    def _layer(self, layer: GemmaLayer, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, step: Any) -> torch.Tensor:
        """One layer on ``x`` ``(T, D)`` (module docstring's pseudo-code)."""
        tokens, dim = x.shape[0], self.head_dim
        h = gemma_norm(x, layer.input_norm, layer.eps)  # (T, D)
        q, k, v = layer.qkv.forward(h).split(
            [self.heads * dim, self.kv_heads * dim, self.kv_heads * dim], dim=-1)
        q = q.view(tokens, self.heads, dim)  # (T, H, Dh)
        k = k.view(tokens, self.kv_heads, dim)  # (T, KVH, Dh)
        v = v.view(tokens, self.kv_heads, dim)  # (T, KVH, Dh)
        if layer.q_norm is not None:
            q = gemma_norm(q, layer.q_norm, layer.head_eps)
            k = gemma_norm(k, layer.k_norm, layer.head_eps)  # contiguous (T, KVH, Dh)
            v = v.contiguous()  # the rotary kernel reads k and v with one token stride
        out = ops.attend(q, k, v, cos, sin, step, layer.index, self.scale, layer.window,
                         self.softcap)  # (T, H, Dh)
        attended = layer.o.forward(out.reshape(tokens, -1))  # (T, D)
        x = x + gemma_norm(attended, layer.post_attention_norm, layer.eps)
        h = gemma_norm(x, layer.pre_feedforward_norm, layer.eps)
        mlp = ops.mlp(h, layer.gate_up, layer.down, self.intermediate, native_silu=False,
                      activation=self.activation)  # (T, D)
        return x + gemma_norm(mlp, layer.post_feedforward_norm, layer.eps)


def _norm(module: Any) -> tuple[Any, float] | None:
    """``(1 + w as float32 (D,), eps)`` of a transformers Gemma RMSNorm, or None."""
    import torch

    if type(module).__name__ not in NORM_CLASSES or getattr(module, "weight", None) is None:
        return None
    weight = module.weight.detach().to(torch.float32)
    return (1.0 + weight).contiguous(), float(module.eps)


def _ropes(decoder: Any, config: Any, head_dim: int) -> tuple[Any, list[int]]:
    """``(ropes, rope_index)``: the distinct ``(inv_freq, attention scaling)`` of the
    decoder's rotary module and each layer's index into them (Gemma 3 keeps one set of
    frequencies per layer type, Gemma 2 one for all); ``(None, [])`` where the rotary kernel
    cannot rotate them (logged)."""
    rotary = decoder.rotary_emb
    layer_types = list(getattr(config, "layer_types", None) or [])
    kinds = sorted(set(layer_types))
    if kinds and all(hasattr(rotary, f"{kind}_inv_freq") for kind in kinds):
        ropes = [(getattr(rotary, f"{kind}_inv_freq"),
                  float(getattr(rotary, f"{kind}_attention_scaling"))) for kind in kinds]
        rope_index = [kinds.index(kind) for kind in layer_types]
    elif getattr(rotary, "inv_freq", None) is not None:
        ropes = [(rotary.inv_freq, float(rotary.attention_scaling))]
        rope_index = [0] * config.num_hidden_layers
    else:
        logger.info("no owned CPU model for this Gemma: a layer type without rotary "
                    "frequencies (%s)", kinds)
        return None, []
    for inv_freq, _ in ropes:
        refusal = rotary_refusal(rotary, head_dim, inv_freq)
        if refusal is not None:
            logger.info("no owned CPU model for this Gemma: %s", refusal)
            return None, []
    return ropes, rope_index


def _layer(module: Any, index: int, groups: list[FusedProjections],
           rope: int) -> GemmaLayer | None:
    """The weights of transformers' Gemma decoder layer ``module``, or None where its q/k/v
    or gate/up are not fused groups or a norm is not Gemma's."""
    attention, mlp = module.self_attn, module.mlp
    qkv = group_of(groups, [attention.q_proj, attention.k_proj, attention.v_proj])
    gate_up = group_of(groups, [mlp.gate_proj, mlp.up_proj])
    norms = [_norm(getattr(module, name, None)) for name in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
        "post_feedforward_layernorm")]
    if qkv is None or gate_up is None or None in norms or gate_up.sizes[0] != gate_up.sizes[1]:
        return None
    head_norms: list[Any] = [None, None]
    head_eps = 0.0
    if hasattr(attention, "q_norm"):  # Gemma 3
        found = [_norm(attention.q_norm), _norm(attention.k_norm)]
        if None in found:
            return None
        (q_w, head_eps), (k_w, _) = found  # type: ignore[misc]
        head_norms = [q_w, k_w]
    (norm1, eps), (norm2, _), (norm3, _), (norm4, _) = norms  # type: ignore[misc]
    return GemmaLayer(index=index, input_norm=norm1, post_attention_norm=norm2,
                      pre_feedforward_norm=norm3, post_feedforward_norm=norm4, eps=eps,
                      qkv=qkv.linear, o=attention.o_proj, gate_up=gate_up.linear,
                      down=mlp.down_proj, q_norm=head_norms[0], k_norm=head_norms[1],
                      head_eps=head_eps, window=getattr(attention, "sliding_window", None),
                      rope=rope)
