"""Paged decode attention of a whole step in one native call, float32 or bfloat16, and
float32 queries over a float16 cache (half the bytes a decode streams per cached token).

Every decoding request of the step attends its own blocks of the paged cache through its row
of an int32 block table (``paged_attention.c``): no gather, no per-request Python, no padded
batch. Used by the CPU attention backend for decodes over unrelated contexts and single
requests, and available as the torch custom op ``langchain_ascend::paged_decode_attention``
(:func:`paged_decode_op`) so a compiled step sees it as one opaque node.

:func:`paged_decode` returns None wherever the kernel does not apply (library not built here,
another dtype or device, a layout it does not read), so callers keep their torch path.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "paged_attention"
OP_NAME = "langchain_ascend::paged_decode_attention"
SPLIT_KEYS = 256
"""Keys of one work item's range (whole blocks): fixed, so each row is cut the same way
whatever the batch and the row's result does not depend on the other rows."""
STATE_BYTES = 32 << 20
"""Most bytes of per-range row states one call holds (``(rows, H, ranges, D + 2)`` float32):
a long prefill's rows go in several calls, which gives the same bits (rows are independent)
and keeps an 8B model's 1k-token step at a long context from allocating hundreds of MB."""


def _kernel(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> Any:
    import torch

    symbol = {(torch.float32, torch.float32): "paged_decode_f32_softcap",
              (torch.bfloat16, torch.bfloat16): "paged_decode_bf16_softcap",
              (torch.float32, torch.float16): "paged_decode_f32_f16kv_softcap",
              }.get((dtype, cache_dtype or dtype))
    if symbol is None:
        return None
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    return build.function(KERNEL, symbol, [
        ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, f32, f32, i64,
        ctypes.c_int])


def available(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> bool:
    """Whether the kernel for ``dtype`` queries over a ``cache_dtype`` cache (default: the
    same) is built and loaded here (builds it on first call)."""
    return _kernel(dtype, cache_dtype) is not None


def unavailable_reason() -> str:
    """Where the kernel was loaded from, or why it is not."""
    return build.load(KERNEL).reason




def applies(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel reads these tensors: ``query (B, H, D)`` and a contiguous
    ``(2, KVH, NB, BS, D)`` cache of the same float32/bfloat16 dtype (or float32 queries over a
    float16 cache) on CPU, ``D % 8 == 0``."""
    return (query.dim() == 3 and kv_cache.dim() == 5
            and _kernel(query.dtype, kv_cache.dtype) is not None
            and query.device.type == "cpu" and kv_cache.device.type == "cpu"
            and query.shape[2] == kv_cache.shape[4] and query.shape[2] % 8 == 0
            and query.shape[1] % kv_cache.shape[1] == 0 and kv_cache.is_contiguous())


def paged_decode(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, window: int = 0,
                 softcap: float = 0.0) -> torch.Tensor | None:
    """Attention of each request's one query token over its cached keys.

    Args:
        query: ``(B, H, D)`` float32 or bfloat16.
        kv_cache: ``(2, KVH, NB, BS, D)`` of the same dtype, contiguous; this step's keys and
            values already written.
        block_tables: ``(B, W)`` int32, row ``b`` covering ``seq_lens[b]`` slots.
        seq_lens: ``(B,)`` int64 context lengths (the new token included).
        scale: Applied to ``q . k``.
        window: Sliding window (0: none): only the last ``window`` keys are attended.
        softcap: Logit soft-cap (0: none): each scaled score ``s`` becomes
            ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2).

    Returns:
        ``(B, H, D)`` in ``query``'s dtype, or None where the kernel does not apply.

    Raises:
        ValueError: A block id of a table is outside the cache, or ``softcap < 0``.
    """
    import torch

    if softcap < 0:
        raise ValueError(f"paged decode attention: softcap must be >= 0 (0: none), got {softcap}")
    if not applies(query, kv_cache):
        return None
    if (block_tables.dtype != torch.int32 or block_tables.dim() != 2
            or block_tables.stride(1) != 1 or seq_lens.dtype != torch.int64
            or not seq_lens.is_contiguous() or block_tables.shape[0] != query.shape[0]
            or seq_lens.shape != (query.shape[0],)):
        return None
    batch, heads, dim = query.shape
    query = query.contiguous()
    out = torch.empty_like(query)
    longest = int(seq_lens.max()) if window <= 0 else min(int(seq_lens.max()), window)
    row_bytes = heads * -(-longest // SPLIT_KEYS) * (dim + 2) * 4
    step = max(1, STATE_BYTES // row_bytes)
    for first in range(0, batch, step):
        rows = slice(first, min(batch, first + step))
        _run(query[rows], kv_cache, block_tables[rows], seq_lens[rows], out[rows], scale,
             window, softcap)
    return out


def _run(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
         seq_lens: torch.Tensor, out: torch.Tensor, scale: float, window: int,
         softcap: float) -> None:
    """One kernel call over contiguous ``query`` / ``out`` rows (see :func:`paged_decode`)."""
    import torch

    batch, heads, dim = query.shape
    kv_heads, blocks, block_size = kv_cache.shape[1], kv_cache.shape[2], kv_cache.shape[3]
    status = _kernel(query.dtype, kv_cache.dtype)(
        query.data_ptr(), kv_cache.data_ptr(), block_tables.data_ptr(), block_tables.stride(0),
        seq_lens.data_ptr(), out.data_ptr(), batch, heads, kv_heads, dim, blocks, block_size,
        window, scale, softcap, SPLIT_KEYS, torch.get_num_threads())
    if status == 1:
        raise MemoryError("paged decode attention kernel: out of memory for its scratch")
    if status == 3:
        raise ValueError(f"paged decode attention: a block id is outside [0, {blocks})")
    if status:
        raise RuntimeError(f"paged decode attention kernel failed with status {status}")


_op_lock = threading.Lock()
_op: Any = None


def paged_decode_op() -> Any:
    """The kernel as the torch custom op ``langchain_ascend::paged_decode_attention(query,
    kv_cache, block_tables, seq_lens, scale, window, softcap=0.0) -> out`` (registered on first
    call), for code that is compiled or captured. It raises where the kernel does not apply."""
    global _op
    with _op_lock:
        if _op is None:
            _op = _register_op()
        return _op


def _register_op() -> Any:
    import torch

    @torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cpu", schema=(
        "(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int window, float softcap=0.0) -> Tensor"))
    def op(query, kv_cache, block_tables, seq_lens, scale, window,  # noqa: ANN001, ANN202
           softcap=0.0):  # noqa: ANN001
        out = paged_decode(query, kv_cache, block_tables, seq_lens, scale, window, softcap)
        if out is None:
            raise ValueError("paged_decode_attention: the native kernel does not apply to "
                             f"query {tuple(query.shape)} {query.dtype} and cache "
                             f"{tuple(kv_cache.shape)} {kv_cache.dtype} ({unavailable_reason()})")
        return out

    @op.register_fake
    def _(query, kv_cache, block_tables, seq_lens, scale, window,  # noqa: ANN001, ANN202
          softcap=0.0):  # noqa: ANN001
        return torch.empty_like(query)

    return op
