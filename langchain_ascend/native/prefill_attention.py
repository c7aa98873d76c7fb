"""Prefill attention straight from the paged cache, one native call per segment and layer.

A prefill segment's new tokens attend causally to everything before them: an agent's cached
system prompt and its earlier turns (thousands of keys) and each other. Torch's SDPA needs
those keys gathered and widened into one tensor and then runs at about half of this CPU's
multiply-add rate; ``prefill_attention.c`` reads the pages through the block table, widens
each chunk of keys once into a transposed float32 tile shared by every query row, and runs
score and value products blocked like a GEMM (numbers in ``docs/performance.md``).

Each query row's result depends only on its own position, the keys it sees and its query
(chunks of keys at absolute positions): not on the other tokens of the step, the threads, or
how a long prompt was split into chunked-prefill steps.

:func:`prefill` returns None wherever the kernel does not apply (library not built here,
another dtype or device, a head size it does not read), so callers keep their torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "prefill_attention"
MAX_HEAD_DIM = 256
_STATUS = {1: "out of memory for its scratch", 2: "bad arguments (shapes or a block table "
           "too short for the segment)"}


def _kernel(cache_dtype: torch.dtype) -> Any:
    import torch

    symbol = {torch.float32: "prefill_attention_f32",
              torch.float16: "prefill_attention_f32_f16kv"}.get(cache_dtype)
    if symbol is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, symbol, [
        ptr, i64, i64, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, i64, i64, i64,
        ctypes.c_float, ctypes.c_int])


def available(cache_dtype: torch.dtype) -> bool:
    """Whether the kernel for float32 queries over a ``cache_dtype`` cache is built and loaded
    here (builds it on first call)."""
    return _kernel(cache_dtype) is not None


def applies(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel reads these tensors: float32 ``query (n, H, D)`` (head dims
    contiguous) over a contiguous float32 or float16 ``(2, KVH, NB, BS, D)`` cache on CPU,
    ``D % 8 == 0`` and ``D <= 256``, ``H`` a multiple of ``KVH``."""
    import torch

    return (query.dim() == 3 and kv_cache.dim() == 5 and query.dtype == torch.float32
            and query.device.type == "cpu" and kv_cache.device.type == "cpu"
            and query.shape[2] == kv_cache.shape[4] and query.shape[2] % 8 == 0
            and query.shape[2] <= MAX_HEAD_DIM and query.stride(2) == 1
            and query.shape[1] % kv_cache.shape[1] == 0 and kv_cache.is_contiguous()
            and _kernel(kv_cache.dtype) is not None)


def prefill(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
            context_len: int, scale: float, window: int = 0) -> torch.Tensor | None:
    """Attention of a segment's ``n`` new tokens over its context and themselves.

    Args:
        query: ``(n, H, D)`` float32, the tokens at positions ``context_len ..
            context_len + n - 1``.
        kv_cache: ``(2, KVH, NB, BS, D)`` float32 or float16, contiguous; the segment's keys
            and values already written.
        block_table: ``(num_blocks,)`` int32 block ids covering ``context_len + n`` slots.
        context_len: Tokens of the request cached before this segment.
        scale: Applied to ``q . k``.
        window: Sliding window (0: none): a query at ``p`` sees keys ``p - window < j <= p``.

    Returns:
        ``(n, H, D)`` float32, or None where the kernel does not apply.

    Raises:
        ValueError: A block id outside the cache, or a table too short for the segment.
    """
    import torch

    if not applies(query, kv_cache) or block_table.dtype != torch.int32 \
            or block_table.dim() != 1 or not block_table.is_contiguous():
        return None
    n, heads, dim = query.shape
    kv_heads, blocks, block_size = kv_cache.shape[1], kv_cache.shape[2], kv_cache.shape[3]
    out = torch.empty(n, heads, dim, dtype=query.dtype)
    status = _kernel(kv_cache.dtype)(
        query.data_ptr(), query.stride(0), query.stride(1), kv_cache.data_ptr(),
        block_table.data_ptr(), block_table.numel(), out.data_ptr(), n, heads, kv_heads, dim,
        blocks, block_size, context_len, window, scale, torch.get_num_threads())
    if status == 1:
        raise MemoryError(f"prefill attention kernel: {_STATUS[1]}")
    if status == 3:
        raise ValueError(f"prefill attention: a block id is outside [0, {blocks})")
    if status:
        raise ValueError(f"prefill attention kernel: {_STATUS.get(status, status)} (query "
                         f"{tuple(query.shape)}, cache {tuple(kv_cache.shape)}, "
                         f"{block_table.numel()} blocks, context {context_len})")
    return out
