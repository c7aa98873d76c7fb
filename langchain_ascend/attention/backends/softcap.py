"""Scaled dot-product attention with optional logit soft-capping (Gemma 2).

Gemma 2 bounds every attention score before the softmax: ``s -> cap * tanh(s / cap)`` on the
scaled scores ``s = scale * q . k`` (transformers' ``attn_logit_softcapping``).
``torch.nn.functional.scaled_dot_product_attention`` has no such step, so :func:`attention` is
that op where no cap is set (the very call, same bits) and, with a cap, the scores formed
explicitly in float32, capped, masked and normalised. The torch backends call it for every
attention they run; the CPU backend's native kernels take the cap themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
              attn_mask: torch.Tensor | None = None, scale: float, softcap: float | None = None,
              is_causal: bool = False, enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention(query, key, value, ...)``, soft-capped where ``softcap``.

    Args:
        query: ``(..., Hq, n, D)``.
        key: ``(..., Hk, L, D)`` (``Hk`` divides ``Hq`` with ``enable_gqa``, else equal).
        value: ``(..., Hk, L, D)``.
        attn_mask: Boolean (True: visible) or additive, broadcastable to ``(..., Hq, n, L)``.
        scale: Applied to ``q . k``.
        softcap: Logit soft-cap (None or 0: none).
        is_causal: Query ``i`` sees keys ``0 .. i`` (top-left aligned, as SDPA's).
        enable_gqa: Each key head serves ``Hq / Hk`` consecutive query heads.

    Returns:
        ``(..., Hq, n, D)`` in ``query``'s dtype.
    """
    import torch
    import torch.nn.functional as F

    if not softcap:
        if enable_gqa:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                  is_causal=is_causal, scale=scale,
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                              is_causal=is_causal, scale=scale)
    q, k, v = query.float(), key.float(), value.float()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (..., Hq, n, L)
    scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        n, length = scores.shape[-2:]
        attn_mask = torch.ones(n, length, dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v).to(query.dtype)  # (..., Hq, n, D)
