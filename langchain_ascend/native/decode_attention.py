"""Decode attention over one strided run of cached keys: the native kernel, from torch.

One pass over a run of cached keys per KV head with all its query rows, returning the
log-sum-exp the piecewise path merges by; faster than torch's CPU flash attention on the same
views for decode-sized queries (figures in ``docs/performance.md``).

:func:`attend` returns None wherever the kernel does not apply (library not built here,
another dtype or device, rows that are not contiguous), so callers keep their torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "decode_attention"
MIN_KEYS_PER_SPLIT = 512
"""Keys one work item streams at least (fewer: more merging than streaming)."""


def available() -> bool:
    """Whether the kernel is built and loaded in this process (builds it on first call)."""
    return _kernel() is not None


def unavailable_reason() -> str:
    """Where the kernel was loaded from, or why it is not."""
    return build.load(KERNEL).reason


def _kernel() -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, "decode_attention_f32", [
        ptr, ptr, ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, i64, ctypes.c_float, i64,
        ctypes.c_int])


def num_splits(num_heads: int, num_keys: int, num_threads: int) -> int:
    """Key ranges per head: enough work items for two per thread, each of at least
    :data:`MIN_KEYS_PER_SPLIT` keys (pure function)."""
    wanted = -(-2 * num_threads // num_heads)
    return max(1, min(wanted, num_keys // MIN_KEYS_PER_SPLIT))


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
           bias: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Softmax attention of every query row over every key of its head.

    Args:
        query: ``(H, R, D)`` float32.
        keys: ``(H, S, D)`` float32, rows contiguous (``stride(-1) == 1``,
            ``stride(-2) == D``), any head stride.
        values: Same shape and strides as ``keys``.
        bias: ``(R, S)`` float32 additive mask shared by the heads (0 / -inf), rows
            contiguous, or None.
        scale: Applied to ``q . k`` before the mask.

    Returns:
        ``(out (H, R, D), lse (H, R))`` (rows that see no key: zeros and -inf), or None when
        the kernel does not apply to these tensors (see the module docstring).
    """
    import torch

    kernel = _kernel()
    if kernel is None:
        return None
    num_heads, num_rows, head_dim = query.shape
    num_keys = keys.shape[1]
    tensors = (query, keys, values) if bias is None else (query, keys, values, bias)
    if (head_dim % 8 or num_keys == 0 or keys.shape != (num_heads, num_keys, head_dim)
            or values.shape != keys.shape or values.stride() != keys.stride()
            or keys.stride()[1:] != (head_dim, 1)
            or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors)
            or (bias is not None and (bias.shape != (num_rows, num_keys) or bias.stride(1) != 1))):
        return None
    query = query.contiguous()
    out = torch.empty(num_heads, num_rows, head_dim)
    lse = torch.empty(num_heads, num_rows)
    threads = torch.get_num_threads()
    status = kernel(
        query.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.stride(0),
        None if bias is None else bias.data_ptr(), 0 if bias is None else bias.stride(0),
        out.data_ptr(), lse.data_ptr(), num_heads, num_rows, num_keys, head_dim, scale,
        num_splits(num_heads, num_keys, threads), threads)
    if status == 1:
        raise MemoryError("decode attention kernel: out of memory for its scratch buffers")
    if status:
        raise RuntimeError(f"decode attention kernel failed with status {status}")
    return out, lse
