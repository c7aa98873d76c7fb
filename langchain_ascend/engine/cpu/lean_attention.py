"""A lean ``forward`` for the attention modules of known decoder families on the CPU.

Transformers' Llama-style attention runs about twenty small ops per layer around the
attention itself -- three views and transposes, the rotary embedding as ``neg``/``cat``/four
products and two sums, the cache write as two ``index_copy_``, the attention-interface
dispatch -- each a few microseconds that a CPU decode step pays thirty times. The lean
forward keeps the module's own projections (and Qwen3's per-head norms), then rotates the
queries and keys and writes the keys and values into the paged cache in ONE native call
(``native.rope_kv``: the same rounding as ``apply_rotary_pos_emb``), and attends through the
backend's :meth:`~langchain_ascend.attention.backends.torch_ref.TorchRefBackend.attend`.
Where the q/k/v projections are one fused product (``fused_projections``), it calls that
product once and splits it, skipping the members' module calls. :func:`lean_attend` is the
same path for a caller that has the step at hand (``engine.cpu.lean_layer``).

Only the module instances' ``forward`` is swapped (``engine.cpu.swap``); a call the lean path
cannot take -- no paged step (plain transformers use), an HF cache object, a backend of
another cache layout, rotary tables of another shape -- runs the class's own forward.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import families
from langchain_ascend.attention import registry
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.engine.cpu.fused_projections import group_of
from langchain_ascend.engine.cpu.swap import is_swapped, swap_forward
from langchain_ascend.native import rope_kv

logger = logging.getLogger(__name__)

LEAN_ATTENTION = families.native_classes("Attention")
"""Classes whose forward is: projections, (Qwen3: per-head RMSNorm of q and k),
``apply_rotary_pos_emb``, attention with ``self.scaling`` and the module's sliding window,
``o_proj`` -- and nothing else."""


def sliding_window(module: Any) -> int | None:
    """The window the module's own forward passes to the attention function."""
    if type(module).__name__ == "MistralAttention":
        return getattr(module.config, "sliding_window", None)
    return getattr(module, "sliding_window", None)


def _lean_forward(self: Any, hidden_states: Any, position_embeddings: Any = None,
                  attention_mask: Any = None, past_key_values: Any = None, **kwargs: Any) -> Any:
    step = kwargs.get(registry.STEP_KWARG)
    out = None
    if past_key_values is None:
        out = lean_attend(self, hidden_states, position_embeddings, step)
    if out is None:  # nothing written: the class's forward does all of it
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask,
                                  past_key_values, **kwargs)
    return out, None


def _project(self: Any, hidden_states: Any) -> tuple[Any, Any, Any]:
    """``(query, key, value)`` ``(1, T, H*D)``, ``(1, T, KVH*D)`` x2 of ``hidden_states``
    ``(1, T, hidden)``: one product of the fused q/k/v group where there is one
    (``engine.cpu.fused_projections``), split into views, else the three projections."""
    group = self.lean_qkv
    if group is not None:
        query, key, value = group.linear.forward(hidden_states).split(group.sizes, dim=-1)
        return query, key, value
    return self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)


def lean_attend(self: Any, hidden_states: Any, position_embeddings: Any, step: Any) -> Any:
    """The lean attention of module ``self`` (swapped by :func:`lean_attention`) on
    ``hidden_states`` ``(1, T, hidden)`` within the paged ``step``: ``(1, T, hidden)`` after
    ``o_proj``, with this layer's keys and values written; or None, with nothing written,
    where the lean path does not apply (no step, another backend, rotary tables the kernel
    does not take) and the class forward must run instead."""
    if (step is None or position_embeddings is None
            or not isinstance(step.backend, TorchRefBackend) or hidden_states.shape[0] != 1):
        return None
    tokens, dim = hidden_states.shape[1], self.head_dim
    query, key, value = _project(self, hidden_states)
    query = query.view(tokens, -1, dim)  # (T, H, D)
    key = key.view(tokens, -1, dim)  # (T, KVH, D)
    value = value.view(tokens, -1, dim)  # (T, KVH, D)
    if self.lean_head_norms:
        query, key = self.q_norm(query), self.k_norm(key)
    cos, sin = position_embeddings  # (1, T, D) each
    kv_cache = step.kv_caches[int(self.layer_idx)]
    rotated = rope_kv.rope_and_write(query, key, value, cos[0], sin[0],
                                     step.metadata.slot_mapping, kv_cache)
    if rotated is None:
        return None
    query, key = rotated  # (T, H, D), (T, KVH, D)
    out = step.backend.attend(query, key, value, kv_cache, step.metadata, self.scaling,
                              sliding_window(self))  # (T, H, D)
    return self.o_proj.forward(out.reshape(1, tokens, -1))  # (1, T, hidden)


def is_lean_capable(module: Any) -> bool:
    """Whether ``module`` is an attention module of a known family with its own forward."""
    return (type(module).__name__ in LEAN_ATTENTION and not is_swapped(module)
            and all(hasattr(module, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                       "head_dim", "scaling", "layer_idx")))


def lean_attention(model: Any) -> list[Any]:
    """Swap every lean-capable attention module of ``model`` to the lean forward.

    Returns:
        The modules switched (none where the native kernel cannot be built).
    """
    first = next(model.parameters())
    if not rope_kv.available(first.dtype):
        return []
    lean = [module for module in model.modules() if is_lean_capable(module)]
    for module in lean:
        module.lean_head_norms = type(module).__name__ == "Qwen3Attention"
        module.lean_qkv = group_of([module.q_proj, module.k_proj, module.v_proj])
        swap_forward(module, _lean_forward, "lean_attention")
    if lean:
        logger.info("lean attention forward on %d modules", len(lean))
    return lean
