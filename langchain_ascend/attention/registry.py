"""Plug our paged attention into transformers without touching the model code.

``register()`` adds :func:`paged_attention_forward` to transformers' ``AttentionInterface``
under :data:`ATTN_IMPLEMENTATION`; a model loaded with
``attn_implementation=ATTN_IMPLEMENTATION`` then calls it from every attention layer with
``(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)``.

Masks: transformers' ``create_causal_mask`` returns ``None`` straight away for an
implementation that is absent from ``AttentionMaskInterface`` ("custom attention without
equivalent mask creation: we don't need a mask"), so we deliberately register no mask
function: that skips mask materialisation and the packed-sequence detection (which would
read a device value back to the host every step). Our attention builds its own masks from the
step metadata.

The step's metadata reaches the function as the keyword argument :data:`STEP_KWARG` (the
Qwen2/Qwen3/Llama/Mistral... modeling files forward unknown keyword arguments from the model's
``forward`` down to the attention function).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import UnsupportedModelFeatureError

if TYPE_CHECKING:
    import torch

    from langchain_ascend.attention.backends.base import AttentionBackend

ATTN_IMPLEMENTATION = "langchain_ascend_paged"
STEP_KWARG = "paged_attention_step"

_lock = threading.Lock()


@dataclass
class PagedAttentionStep:
    """What every attention layer needs for one packed step.

    Attributes:
        backend: The attention backend that writes the cache and attends.
        kv_caches: One cache tensor per decoder layer, indexed by ``module.layer_idx``.
        metadata: ``backend.build_metadata(layout)`` for this step.
    """

    backend: AttentionBackend
    kv_caches: list[torch.Tensor]
    metadata: Any


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function over our paged KV cache.

    Args:
        module: The attention module (its ``layer_idx`` picks the layer's cache).
        query: ``(1, num_heads, T, head_dim)`` for the ``T`` packed tokens.
        key: ``(1, num_kv_heads, T, head_dim)``.
        value: ``(1, num_kv_heads, T, head_dim)``.
        attention_mask: Ignored (None for our implementation); masks come from the metadata.
        scaling: Softmax scale; ``head_dim ** -0.5`` when None.
        dropout: Must be 0 (inference only).
        **kwargs: Must carry :data:`STEP_KWARG`; ``sliding_window`` and ``softcap`` (Gemma 2's
            attention logit soft-cap) are honoured.

    Returns:
        ``((1, T, num_heads, head_dim) output, None)`` as transformers expects.
    """
    step: PagedAttentionStep | None = kwargs.get(STEP_KWARG)
    if step is None:
        raise RuntimeError(
            f"attention implementation {ATTN_IMPLEMENTATION!r} needs the {STEP_KWARG!r} keyword "
            "argument: run the model through langchain_ascend's ModelRunner")
    if query.shape[0] != 1:
        raise ValueError(f"paged attention expects one packed sequence, got batch {query.shape[0]}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = step.backend.forward(
        query[0].transpose(0, 1),  # (T, H, D)
        key[0].transpose(0, 1),  # (T, KVH, D)
        value[0].transpose(0, 1),  # (T, KVH, D)
        step.kv_caches[int(module.layer_idx)],  # type: ignore[arg-type]
        step.metadata,
        scale,
        kwargs.get("sliding_window"),
        kwargs.get("softcap"),
    )  # (T, H, D)
    return out[None], None  # (1, T, H, D)


def check_backend_runs(backend: AttentionBackend | type[AttentionBackend], config: Any) -> None:
    """Refuse at engine start a model whose attention ``backend`` (or backend class) cannot
    run; ``config`` is the model's transformers config.

    Raises:
        UnsupportedModelFeatureError: ``config`` sets ``attn_logit_softcapping`` (Gemma 2)
            and the backend applies no soft-cap; the message names the model, the field and
            the backend to use instead.
    """
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap and not backend.supports_softcap:
        model = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "?")
        raise UnsupportedModelFeatureError(
            f"model {model!r} ({getattr(config, 'model_type', '?')}) sets "
            f"attn_logit_softcapping={cap}, which the {backend.name} attention backend's kernel "
            "does not apply: use attention_backend='torch_ref' (soft-capped in torch)")


def register() -> str:
    """Register :func:`paged_attention_forward` with transformers (idempotent, thread-safe).

    Returns:
        The ``attn_implementation`` name to load models with.
    """
    from transformers import AttentionInterface

    with _lock:
        if AttentionInterface._global_mapping.get(ATTN_IMPLEMENTATION) is not paged_attention_forward:
            AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
