"""Single-row products of row-major linear weights: the native kernel, from torch.

Used by ``engine.weight_layout`` for the one-row products of a decode step on the layers it
keeps row-major (``matvec.c``; measured there). :func:`matvec` returns None wherever the
kernel does not apply (library not built here, another dtype or device, a weight that is not
row-major), so callers keep their torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "matvec"


def available() -> bool:
    """Whether the kernel is built and loaded in this process (builds it on first call)."""
    return _kernel() is not None


def _kernel() -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, "matvec_f32", [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_int])


def applies_to(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether :func:`matvec` takes this layer: float32 on CPU, row-major, ``in % 8 == 0``."""
    import torch

    return (available() and weight.dim() == 2 and weight.dtype == torch.float32
            and weight.device.type == "cpu" and weight.is_contiguous()
            and weight.shape[1] % 8 == 0
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())))


def matvec(weight: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None,
           ) -> torch.Tensor | None:
    """``weight (out, in) @ row (in,) [+ bias (out,)]`` -> ``(out,)``, or None (see above).

    The caller checks the weight once with :func:`applies_to`; ``row`` is made contiguous.
    """
    import torch

    kernel = _kernel()
    if kernel is None or row.dtype != torch.float32:
        return None
    row = row.contiguous()
    out = torch.empty(weight.shape[0], dtype=torch.float32)
    status = kernel(weight.data_ptr(), row.data_ptr(), None if bias is None else bias.data_ptr(),
                    out.data_ptr(), weight.shape[0], weight.shape[1], torch.get_num_threads())
    if status:
        raise RuntimeError(f"matvec kernel failed with status {status}")
    return out
