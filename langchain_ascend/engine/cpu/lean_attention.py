"""A lean ``forward`` for the attention modules of known decoder families on the CPU.

Transformers' Llama-style attention runs about twenty small ops per layer around the
attention itself -- three views and transposes, the rotary embedding as ``neg``/``cat``/four
products and two sums, the cache write as two ``index_copy_``, the attention-interface
dispatch -- each a few microseconds that a CPU decode step pays thirty times. The lean
forward keeps the module's own projections (and Qwen3's per-head norms), then rotates the
queries and keys and writes the keys and values into the paged cache in ONE native call
(``native.rope_kv``: the same rounding as ``apply_rotary_pos_emb``), and attends through the
backend's :meth:`~langchain_ascend.attention.backends.torch_ref.TorchRefBackend.attend`.

Only the module instances' ``forward`` is swapped (``engine.cpu.swap``); a call the lean path
cannot take -- no paged step (plain transformers use), an HF cache object, a backend of
another cache layout, rotary tables of another shape -- runs the class's own forward.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend.attention import registry
from langchain_ascend.engine.cpu.swap import is_swapped, swap_forward
from langchain_ascend.native import rope_kv

logger = logging.getLogger(__name__)

LEAN_ATTENTION = frozenset({"LlamaAttention", "MistralAttention", "Qwen2Attention",
                            "Qwen3Attention"})
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
    from langchain_ascend.attention.backends.torch_ref import TorchRefBackend

    step = kwargs.get(registry.STEP_KWARG)
    if (step is None or past_key_values is not None or position_embeddings is None
            or not isinstance(step.backend, TorchRefBackend) or hidden_states.shape[0] != 1):
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask,
                                  past_key_values, **kwargs)
    tokens, dim = hidden_states.shape[1], self.head_dim
    query = self.q_proj(hidden_states).view(tokens, -1, dim)  # (T, H, D)
    key = self.k_proj(hidden_states).view(tokens, -1, dim)  # (T, KVH, D)
    value = self.v_proj(hidden_states).view(tokens, -1, dim)  # (T, KVH, D)
    if self.lean_head_norms:
        query, key = self.q_norm(query), self.k_norm(key)
    cos, sin = position_embeddings  # (1, T, D) each
    kv_cache = step.kv_caches[int(self.layer_idx)]
    rotated = rope_kv.rope_and_write(query, key, value, cos[0], sin[0],
                                     step.metadata.slot_mapping, kv_cache)
    if rotated is None:  # nothing written: the class's forward does all of it
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask,
                                  past_key_values, **kwargs)
    query, key = rotated  # (T, H, D), (T, KVH, D)
    out = step.backend.attend(query, key, value, kv_cache, step.metadata, self.scaling,
                              sliding_window(self))  # (T, H, D)
    return self.o_proj(out.reshape(1, tokens, -1)), None  # (1, T, hidden)


def is_lean_capable(module: Any) -> bool:
    """Whether ``module`` is an attention module of a known family with its own forward."""
    return (type(module).__name__ in LEAN_ATTENTION and not is_swapped(module)
            and all(hasattr(module, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                       "head_dim", "scaling", "layer_idx")))


def lean_attention(model: Any) -> int:
    """Swap every lean-capable attention module of ``model`` to the lean forward.

    Returns:
        How many modules were switched (0 where the native kernel cannot be built).
    """
    first = next(model.parameters())
    if not rope_kv.available(first.dtype):
        return 0
    count = 0
    for module in model.modules():
        if is_lean_capable(module):
            module.lean_head_norms = type(module).__name__ == "Qwen3Attention"
            swap_forward(module, _lean_forward, "lean_attention")
            count += 1
    if count:
        logger.info("lean attention forward on %d modules", count)
    return count
