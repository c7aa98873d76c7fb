"""Prefill attention straight from the paged cache: one native call per step and layer.

A prefill segment's new tokens attend causally to everything before them: an agent's cached
system prompt and its earlier turns (thousands of keys) and each other. Torch's SDPA needs
those keys gathered and widened into one tensor and then runs at about half of this CPU's
multiply-add rate; ``prefill_attention.c`` reads the pages through the block table, widens
each chunk of keys once into a transposed float32 tile shared by every query row, and runs
score and value products blocked like a GEMM (numbers in ``docs/performance.md``).

Each query row's result depends only on its own position, the keys it sees and its query
(chunks of keys at absolute positions): not on the other tokens or segments of the step, the
threads, or how a long prompt was split into chunked-prefill steps -- for a finite cache (an
infinite value next to a row's keys can reach it as 0 * inf). A NaN or infinite score makes
its row NaN, as the softmax's result is. (A one-token piece of a prompt is a decode row and
runs the paged decode kernel, whose rounding differs.)

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
        ptr, i64, i64, ptr, ptr, i64, ptr, i64, ptr, i64, i64, i64, i64, i64, i64,
        ctypes.c_float, ctypes.c_float, ctypes.c_int])


def force_avx2(on: bool) -> bool:
    """Run the kernel's AVX2 products even where the CPU has AVX-512F (``on``), or let it
    choose again; returns the previous setting (tests compare the two forms bit for bit).

    Raises:
        RuntimeError: The kernel is not built here.
    """
    setter = build.function(KERNEL, "prefill_attention_force_avx2", [ctypes.c_int])
    if setter is None:
        raise RuntimeError("the prefill attention kernel is not built here")
    return bool(setter(int(on)))


def wide_products() -> bool:
    """Whether this CPU runs the kernel's AVX-512F products (16 lanes; the same bits as AVX2's
    8)."""
    return "avx512f" in build.cpu_flags()


def available(cache_dtype: torch.dtype) -> bool:
    """Whether the kernel for float32 queries over a ``cache_dtype`` cache is built and loaded
    here (builds it on first call)."""
    return _kernel(cache_dtype) is not None


def applies(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel reads these tensors: float32 ``query (T, H, D)`` (head dims
    contiguous) over a contiguous float32 or float16 ``(2, KVH, NB, BS, D)`` cache on CPU,
    ``D % 8 == 0`` and ``D <= 256``, ``H`` a multiple of ``KVH``."""
    import torch

    return (query.dim() == 3 and kv_cache.dim() == 5 and query.dtype == torch.float32
            and query.device.type == "cpu" and kv_cache.device.type == "cpu"
            and query.shape[2] == kv_cache.shape[4] and query.shape[2] % 8 == 0
            and query.shape[2] <= MAX_HEAD_DIM and query.stride(2) == 1 and query.shape[1] > 0
            and query.shape[1] % kv_cache.shape[1] == 0 and kv_cache.is_contiguous()
            and _kernel(kv_cache.dtype) is not None)


def prefill_segments(query: torch.Tensor, kv_cache: torch.Tensor, segments: torch.Tensor,
                     tables: torch.Tensor, scale: float,
                     window: int = 0, softcap: float = 0.0) -> torch.Tensor | None:
    """Attention of every prefill segment of a step, in one call.

    Args:
        query: ``(T, H, D)`` float32: the segments' new tokens, each segment a run of rows.
        kv_cache: ``(2, KVH, NB, BS, D)`` float32 or float16, contiguous; the segments' keys
            and values already written.
        segments: ``(S, 3)`` int64 rows ``(first query row, new tokens n, context length)``:
            token ``i`` of a segment sits at position ``context + i``.
        tables: ``(S, W)`` int32, row ``s`` the blocks covering ``context + n`` slots of
            segment ``s`` (padding after them is not read).
        scale: Applied to ``q . k``.
        window: Sliding window (0: none): a query at ``p`` sees keys ``p - window < j <= p``.
        softcap: Logit soft-cap (0: none): each scaled score ``s`` becomes
            ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2).

    Returns:
        ``(T, H, D)`` float32 (rows no segment covers are left unset), or None where the
        kernel does not apply.

    Raises:
        ValueError: A block id outside the cache, a segment outside the query or a table too
            short for its segment; ``softcap < 0``.
    """
    import torch

    if softcap < 0:
        raise ValueError(f"prefill attention: softcap must be >= 0 (0: none), got {softcap}")
    if (not applies(query, kv_cache) or tables.dtype != torch.int32 or tables.dim() != 2
            or not tables.is_contiguous() or segments.dtype != torch.int64
            or segments.shape != (tables.shape[0], 3) or not segments.is_contiguous()):
        return None
    rows, heads, dim = query.shape
    out = torch.empty(rows, heads, dim, dtype=query.dtype)
    if segments.shape[0] == 0:
        return out
    if int((segments[:, 0] + segments[:, 1]).max()) > rows:
        raise ValueError(f"prefill attention: a segment runs past the query's {rows} rows")
    kv_heads, blocks, block_size = kv_cache.shape[1], kv_cache.shape[2], kv_cache.shape[3]
    status = _kernel(kv_cache.dtype)(
        query.data_ptr(), query.stride(0), query.stride(1), kv_cache.data_ptr(),
        segments.data_ptr(), segments.shape[0], tables.data_ptr(), tables.shape[1],
        out.data_ptr(), heads, kv_heads, dim, blocks, block_size, window, scale, softcap,
        torch.get_num_threads())
    if status == 1:
        raise MemoryError(f"prefill attention kernel: {_STATUS[1]}")
    if status == 3:
        raise ValueError(f"prefill attention: a block id is outside [0, {blocks})")
    if status:
        raise ValueError(f"prefill attention kernel: {_STATUS.get(status, status)} (query "
                         f"{tuple(query.shape)}, cache {tuple(kv_cache.shape)}, segments "
                         f"{segments.tolist()}, tables of {tables.shape[1]} blocks)")
    return out


def prefill(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
            context_len: int, scale: float, window: int = 0,
            softcap: float = 0.0) -> torch.Tensor | None:
    """:func:`prefill_segments` for one segment: ``query (n, H, D)`` at positions
    ``context_len ..``, ``block_table (num_blocks,)`` int32 -> ``(n, H, D)`` or None."""
    import torch

    if block_table.dim() != 1:
        return None
    if query.shape[0] == 0:
        return query.new_empty(query.shape) if applies(query, kv_cache) else None
    segment = torch.tensor([[0, query.shape[0], context_len]], dtype=torch.int64)
    return prefill_segments(query, kv_cache, segment, block_table[None], scale, window, softcap)
