"""RMSNorm of a few float32 or bfloat16 rows: the native kernels, from torch.

Used by the owned CPU models (``engine.cpu.models.ops.rms_norm``) (``rms_norm.c``; measured there).
:func:`rms_norm` (float32) and :func:`rms_norm_bf16` (bfloat16, transformers' rounding order)
return None wherever the kernel does not apply (library not built here,
another dtype or device, more rows than :data:`MAX_ROWS`), so callers keep their torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "rms_norm"
MAX_ROWS = 64
"""More rows than this go to torch, whose op runs on every thread (the kernel uses one)."""


def available() -> bool:
    """Whether the kernel is built and loaded in this process (builds it on first call)."""
    return _kernel() is not None


def _kernel(symbol: str = "rms_norm_f32") -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, symbol, [ptr, ptr, ptr, i64, i64, i64, ctypes.c_float])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             max_rows: int | None = MAX_ROWS) -> torch.Tensor | None:
    """``weight * x / sqrt(mean(x^2, -1) + eps)`` over the last dimension, or None.

    Args:
        x: ``(..., H)`` float32 on CPU with contiguous rows; ``H % 8 == 0``.
        weight: ``(H,)`` float32, contiguous.
        eps: Added to the mean square.
        max_rows: More rows than this return None (None: any number of rows).
    """
    import torch

    return _run("rms_norm_f32", torch.float32, x, weight, eps, max_rows)


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float,
                  max_rows: int | None = MAX_ROWS) -> torch.Tensor | None:
    """transformers' ``LlamaRMSNorm`` of bfloat16 ``x``: ``h = x.float() * rsqrt(mean(x^2) +
    eps)``, then ``weight * h.to(bf16)`` (each product rounded to bf16), or None.

    Args:
        x: ``(..., H)`` bfloat16 on CPU with contiguous rows; ``H % 8 == 0``.
        weight: ``(H,)`` bfloat16, contiguous.
        eps: Added to the mean square.
        max_rows: More rows than this return None (None: any number of rows).
    """
    import torch

    return _run("rms_norm_bf16", torch.bfloat16, x, weight, eps, max_rows)


def _run(symbol: str, dtype: torch.dtype, x: torch.Tensor, weight: torch.Tensor, eps: float,
         max_rows: int | None) -> torch.Tensor | None:
    import torch

    kernel = _kernel(symbol)
    size = x.shape[-1]
    if (kernel is None or x.dtype != dtype or weight.dtype != dtype
            or x.device.type != "cpu" or size % 8 or weight.shape != (size,)
            or not weight.is_contiguous() or x.numel() == 0
            or (max_rows is not None and x.numel() > max_rows * size)):
        return None
    rows = x.reshape(-1, size)  # (N, H), a view when the rows are evenly spaced
    if rows.stride(1) != 1:
        return None
    out = torch.empty(x.shape, dtype=dtype)
    status = kernel(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), rows.shape[0], size,
                    rows.stride(0), eps)
    if status:
        raise RuntimeError(f"{symbol} kernel failed with status {status}")
    return out
