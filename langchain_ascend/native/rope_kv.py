"""Rotary embedding of a step's queries and keys plus the cache write, in one native call.

``rope_kv.c`` rotates ``q`` and ``k`` exactly as transformers' ``apply_rotary_pos_emb`` (same
rounding, float32 or bfloat16) and stores the rotated keys and the values at their slots of
the layer's paged cache (of the same dtype, or float16 under float32: rounded to nearest even). Used by ``engine.cpu.models.ops.attend`` on CPU decode and prefill
steps; :func:`rope_and_write` returns None wherever the kernel does not apply, so callers keep
their torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "rope_kv"


def _kernel(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> Any:
    import torch

    symbol = {(torch.float32, torch.float32): "rope_kv_f32",
              (torch.bfloat16, torch.bfloat16): "rope_kv_bf16",
              (torch.float32, torch.float16): "rope_kv_f32_f16kv",
              }.get((dtype, cache_dtype or dtype))
    if symbol is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, symbol, [ptr, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr,
                                           i64, i64, i64, i64, i64])


def available(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> bool:
    """Whether the kernel for ``dtype`` inputs and a ``cache_dtype`` cache (default: the same)
    is built and loaded here (builds it on first call)."""
    return _kernel(dtype, cache_dtype) is not None


def _rows_ok(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """``(T, heads, D)`` with contiguous heads of contiguous rows (any token stride)."""
    return (x.dim() == 3 and x.dtype == dtype and x.device.type == "cpu" and x.stride(2) == 1
            and x.stride(1) == x.shape[2])


def rope_and_write(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                   kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rotate ``query``/``key`` and write the rotated keys and ``value`` into ``kv_cache``.

    Args:
        query: ``(T, H, D)``; key, value: ``(T, KVH, D)`` with the same token stride.
        cos, sin: ``(T, D)`` rotary tables of the tokens (transformers' ``position_embeddings``
            without their batch dimension), contiguous.
        slot_mapping: ``(T,)`` int64 cache slot of each token.
        kv_cache: The layer's ``(2, KVH, NB, BS, D)`` cache, contiguous, same dtype (or
            float16 under float32 inputs).

    Returns:
        ``(rotated query (T, H, D), rotated key (T, KVH, D))``, or None where the kernel does
        not apply (nothing written then).

    Raises:
        ValueError: A slot is outside the cache.
    """
    import torch

    dtype = query.dtype
    kernel = _kernel(dtype, kv_cache.dtype)
    tokens, heads, dim = query.shape if query.dim() == 3 else (0, 0, 0)
    if (kernel is None or not all(_rows_ok(x, dtype) for x in (query, key, value))
            or key.shape != value.shape or key.stride() != value.stride() or dim % 16
            or key.shape[0] != tokens or key.shape[2] != dim
            or kv_cache.dim() != 5 or not kv_cache.is_contiguous()
            or kv_cache.shape[1] != key.shape[1] or kv_cache.shape[4] != dim
            or cos.shape != (tokens, dim) or sin.shape != (tokens, dim)
            or cos.dtype != dtype or sin.dtype != dtype
            or not cos.is_contiguous() or not sin.is_contiguous()
            or slot_mapping.dtype != torch.int64 or slot_mapping.shape != (tokens,)
            or not slot_mapping.is_contiguous()):
        return None
    kv_heads = key.shape[1]
    q_out = torch.empty(tokens, heads, dim, dtype=dtype)
    k_out = torch.empty(tokens, kv_heads, dim, dtype=dtype)
    num_slots = kv_cache.shape[2] * kv_cache.shape[3]
    status = kernel(query.data_ptr(), query.stride(0), key.data_ptr(), value.data_ptr(),
                    key.stride(0), cos.data_ptr(), sin.data_ptr(), slot_mapping.data_ptr(),
                    q_out.data_ptr(), k_out.data_ptr(), kv_cache.data_ptr(), tokens, heads,
                    kv_heads, dim, num_slots)
    if status == 3:
        raise ValueError(f"rope_and_write: a slot is outside the cache's {num_slots} slots")
    if status:
        raise RuntimeError(f"rope_kv kernel failed with status {status}")
    return q_out, k_out
