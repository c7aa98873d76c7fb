"""Re-laying block weights into the ``"x8"`` layout at load: the native pass, from torch.

``quant.formats.to_layout`` calls :func:`x8_from_rows` first and keeps its numpy re-laying
where this returns False (library not built here). ``block_layout.c`` says what moves where;
the bytes are the same either way.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build

if TYPE_CHECKING:
    import torch

KERNEL = "block_layout"


def available() -> bool:
    """Whether the kernel is built and loaded in this process (builds it on first call)."""
    return _kernel() is not None


def _kernel() -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, "x8_from_rows", [ptr, i64, i64, i64, i64, i64, ptr, ptr])


def x8_from_rows(source: torch.Tensor, out: torch.Tensor, *, block_bytes: int,
                 fields: Sequence[tuple[int, int, int, int]]) -> bool:
    """Write ``source``'s rows into ``out`` in the ``"x8"`` layout; False (nothing written)
    where the kernel does not apply.

    Args:
        source: ``(N, B * block_bytes)`` uint8 rows of blocks on the CPU, each row contiguous
            (rows may be strided, e.g. a view of a file's memory map); ``N % 8 == 0``.
        out: ``(N / 8, 8 * B * block_bytes)`` contiguous uint8, written.
        block_bytes: Bytes of one block (``quant.formats.bytes_per_block``).
        fields: The block's fields (``quant.x8_fields.field_table``).
    """
    import torch

    kernel = _kernel()
    rows, row_bytes = source.shape
    if (kernel is None or source.dtype != torch.uint8 or out.dtype != torch.uint8
            or source.device.type != "cpu" or rows % 8 or row_bytes % block_bytes
            or source.stride(1) != 1 or not out.is_contiguous()
            or tuple(out.shape) != (rows // 8, 8 * row_bytes)):
        return False
    table = (ctypes.c_int64 * (4 * len(fields)))(*(v for field in fields for v in field))
    status = kernel(source.data_ptr(), source.stride(0), rows // 8,
                    row_bytes // block_bytes, block_bytes, len(fields), table, out.data_ptr())
    if status:
        raise RuntimeError(f"x8_from_rows kernel failed with status {status}")
    return True
