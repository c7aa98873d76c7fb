"""A lean ``forward`` for whole decoder layers of known families on the CPU.

A decoder layer of a Llama-style model is: RMSNorm, attention, residual add, RMSNorm, MLP
(``down(silu(gate(x)) * up(x))``), residual add. Run through transformers' modules, one layer
of a decode step makes about fifteen module calls (the layer, both norms, the attention, its
four projections, the MLP, its three projections and its activation) and the fused groups'
split-and-hand-out bookkeeping; at thirty layers that is several milliseconds a step on top of
the products themselves. The lean layer calls the same prepared pieces directly -- the norms'
and linears' own (native) forwards, the lean attention (``engine.cpu.lean_attention``), the
fused gate/up product once, split -- with the same ops in the same order, so its values are
the class forward's (tested bit for bit). One deliberate exception: an MLP of quantized
products takes ``silu(gate) * up`` from the native decode stack's code, so a decoding row's
bits do not depend on whether its step ran in the stack or here (issue 23).

It applies to a layer whose pieces were all prepared: lean attention, fused q/k/v and
gate/up groups (the ``"dual"`` layout), fused norms, a SiLU MLP -- ``prepare`` hands over the
modules it prepared, no marker is read. Only the layer instances'
``forward`` is swapped (``engine.cpu.swap``); a call the lean path cannot take (no paged step,
an HF cache object, a batch of several sequences) runs the class's own forward.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import families
from langchain_ascend.attention import registry
from langchain_ascend.engine.cpu.fused_projections import group_of
from langchain_ascend.engine.cpu.lean_attention import lean_attend
from langchain_ascend.engine.cpu.quantized_layout import is_quantized_product
from langchain_ascend.engine.cpu.swap import is_swapped, swap_forward
from langchain_ascend.native import stack_kernel as native_stack

logger = logging.getLogger(__name__)

LEAN_LAYERS = families.native_classes("DecoderLayer")
"""Classes whose forward is exactly: norm, attention, residual add, norm, MLP, residual add."""

LEAN_MLPS = families.native_classes("MLP")
"""MLP classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""


def _lean_layer_forward(self: Any, hidden_states: Any, attention_mask: Any = None,
                        position_ids: Any = None, past_key_values: Any = None,
                        use_cache: Any = False, position_embeddings: Any = None,
                        **kwargs: Any) -> Any:
    step = kwargs.get(registry.STEP_KWARG)
    attention = self.self_attn
    if step is None or past_key_values is not None or hidden_states.shape[0] != 1:
        return type(self).forward(self, hidden_states, attention_mask=attention_mask,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  use_cache=use_cache, position_embeddings=position_embeddings,
                                  **kwargs)
    normed = self.input_layernorm.forward(hidden_states)  # (1, T, hidden)
    attended = lean_attend(attention, normed, position_embeddings, step)
    if attended is None:  # nothing written: the attention's own forward does it
        attended, _ = attention(hidden_states=normed, attention_mask=attention_mask,
                                position_ids=position_ids, past_key_values=past_key_values,
                                use_cache=use_cache, position_embeddings=position_embeddings,
                                **kwargs)
    hidden_states = hidden_states + attended  # (1, T, hidden)
    normed = self.post_attention_layernorm.forward(hidden_states)
    return hidden_states + lean_mlp(self.mlp, normed)  # (1, T, hidden)


MLP_CHUNK_BYTES = 16 << 20
"""The most float32 gate/up intermediate a prefill's MLP makes at a time: at Llama-3.2-1B's
width 1,024 rows make 64 MB, which leaves the last-level cache between the three steps (about
11% of the MLP's time, docs/performance.md); 16 MB (256 rows there) stays near. Rows are
independent, so the bits do not depend on the chunking."""


def mlp_row_chunk(gate_up_width: int) -> int:
    """Rows of a prefill's MLP run at a time for a gate/up product ``gate_up_width`` wide: a
    multiple of 64 (the product kernel's row block) whose intermediate fits
    :data:`MLP_CHUNK_BYTES`, at least 64."""
    return max(64, MLP_CHUNK_BYTES // (4 * max(gate_up_width, 1)) // 64 * 64)


def lean_mlp(mlp: Any, x: Any) -> Any:
    """``down(silu(gate(x)) * up(x))`` of a prepared MLP: the fused gate/up product once,
    split into views (``x (..., hidden)`` -> ``(..., hidden)``), by :func:`mlp_row_chunk`
    rows for a long prefill. An MLP of quantized products (``lean_native_silu``) computes
    ``silu(gate) * up`` with the native stack's code (``native.stack_kernel.silu_mul``), so a
    decoding row computed here equals the same row computed by the stack bit for bit (torch's
    SiLU differs in the last float32 bit)."""
    import torch

    rows = x.numel() // x.shape[-1] if x.dim() else 0
    chunk = mlp_row_chunk(sum(mlp.lean_gate_up.sizes))
    if rows <= chunk:
        return _mlp_rows(mlp, x)
    flat = x.reshape(rows, x.shape[-1])  # (M, hidden)
    parts = [_mlp_rows(mlp, part) for part in flat.split(chunk)]  # (<=chunk, hidden)
    return torch.cat(parts).reshape(*x.shape[:-1], parts[0].shape[-1])  # (..., hidden)


def _mlp_rows(mlp: Any, x: Any) -> Any:
    """:func:`lean_mlp` of ``x (..., hidden)`` in one piece."""
    import torch.nn.functional as F

    group = mlp.lean_gate_up
    gate_up = group.linear.forward(x)  # (..., 2I)
    if getattr(mlp, "lean_native_silu", False):
        act = native_stack.silu_mul(gate_up)  # (..., I): the native stack's own code
        if act is not None:
            return mlp.down_proj.forward(act)
    gate, up = gate_up.split(group.sizes, dim=-1)  # (..., I) each
    return mlp.down_proj.forward(F.silu(gate) * up)


def _is_silu(act: Any) -> bool:
    """Whether ``act`` is transformers' or torch's SiLU module (``F.silu`` exactly)."""
    import torch

    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def is_lean_capable(layer: Any, prepared: set[int]) -> bool:
    """Whether ``layer`` is a decoder layer of a known family whose pieces were all prepared
    -- its attention and both norms among ``prepared`` (ids of the modules the lean attention
    and the fused norms switched), a fused q/k/v product, a SiLU MLP with a fused gate/up
    product -- and whose own forward is untouched."""
    if type(layer).__name__ not in LEAN_LAYERS or is_swapped(layer):
        return False
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = [getattr(layer, name, None) for name in ("input_layernorm",
                                                     "post_attention_layernorm")]
    return (attention is not None and id(attention) in prepared
            and getattr(attention, "lean_qkv", None) is not None
            and all(norm is not None and id(norm) in prepared for norm in norms)
            and type(mlp).__name__ in LEAN_MLPS
            and _is_silu(getattr(mlp, "act_fn", None))
            and group_of([getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)])
            is not None)


def lean_layers(model: Any, attention: list[Any], norms: list[Any]) -> list[Any]:
    """Swap every lean-capable decoder layer of ``model`` to the lean forward, given the
    ``attention`` modules ``lean_attention`` and the ``norms`` ``fused_norms`` switched.

    Returns:
        The layers switched, in module order.
    """
    prepared = {id(module) for module in [*attention, *norms]}
    lean = [module for module in model.modules() if is_lean_capable(module, prepared)]
    for module in lean:
        group = group_of([module.mlp.gate_proj, module.mlp.up_proj])
        assert group is not None  # is_lean_capable checked it
        module.mlp.lean_gate_up = group
        # A quantized product gives a row the same bits in the stack and per op, so the
        # SiLU must too: the stack's own (decode_stack.c) instead of torch's.
        module.mlp.lean_native_silu = (is_quantized_product(group.linear)
                                       and group.sizes[0] == group.sizes[1])
        swap_forward(module, _lean_layer_forward, "lean_layer")
    if lean:
        logger.info("lean decoder-layer forward on %d layers", len(lean))
    return lean
