"""Products of linear weights for the CPU decode step: the native kernels, from torch.

Used by ``engine.cpu.weight_layout`` for the products of a decode step (``matvec.c``; layouts
and measurements there): :func:`matvec` on the row-major weight itself, :func:`matvec_tiles`
on a copy made by :func:`pack_tiles`, :func:`matvec_tiles_rows` for any number of rows on that
copy (batched decode; the layout measures where it beats oneDNN); and by
``engine.cpu.greedy_head``: :func:`matvec_tiles_f16` and :func:`greedy_screened_f16` on a
float16 copy made by :func:`pack_tiles_f16`. They return None wherever the kernel does not
apply (library not built here, another dtype or device), so callers keep their torch path.

bfloat16: :func:`matvec_tiles_rows_bf16` takes any number of rows on a bf16 copy made by
:func:`pack_tiles` (float32 accumulation, one rounding to bf16: what torch's bf16 linear
computes, far faster on CPUs without native bf16 math; ``engine.cpu.weight_layout`` measures
where it wins).
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


def _kernel(symbol: str = "matvec_f32") -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, symbol, [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_int])


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

    return _run("matvec_f32", weight, weight.shape[0], weight.shape[1], row, bias)


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """The ``(out, in)`` weight re-laid as ``(out / 8, in, 8)`` tiles for :func:`matvec_tiles`
    (a copy; pure function). ``out`` must be a multiple of 8."""
    out_features, in_features = weight.shape
    if out_features % 8:
        raise ValueError(f"tiles need out_features % 8 == 0, got {out_features}")
    return weight.reshape(out_features // 8, 8, in_features).transpose(1, 2).contiguous()


def matvec_tiles(tiles: torch.Tensor, row: torch.Tensor, bias: torch.Tensor | None,
                 ) -> torch.Tensor | None:
    """``weight @ row [+ bias]`` from ``tiles = pack_tiles(weight)`` -> ``(out,)``, or None."""
    num_tiles, in_features, _ = tiles.shape
    return _run("matvec_tiles_f32", tiles, num_tiles * 8, in_features, row, bias)


def matvec_tiles_rows(tiles: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None,
                      ) -> torch.Tensor | None:
    """``rows (M, in) @ weight^T [+ bias]`` -> ``(M, out)`` float32 from ``tiles =
    pack_tiles(weight)``, for any ``M >= 1``; None where the kernel does not apply (library
    not built here, another dtype or device, mismatched shapes, no rows).

    Each output is one sequential float32 FMA sum over the inputs, then the bias: a row's
    result does not depend on the other rows (one row equals :func:`matvec_tiles`).
    """
    import torch

    return _tiles_rows("matvec_tiles_rows_f32", torch.float32, tiles, rows, bias)


def bf16_available() -> bool:
    """Whether :func:`matvec_tiles_rows_bf16` can run here (builds the library on first call)."""
    return _bf16_kernel() is not None


def _bf16_kernel() -> Any:
    return _rows_kernel("matvec_tiles_rows_bf16")


def _rows_kernel(symbol: str) -> Any:
    """A tiles-times-rows kernel (``matvec_tiles_rows_f32`` / ``_bf16``), typed, or None."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, symbol, [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int])


def matvec_tiles_rows_bf16(tiles: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None,
                           ) -> torch.Tensor | None:
    """``rows (M, in) @ weight^T [+ bias]`` -> ``(M, out)`` bfloat16, for any ``M >= 1``, from
    ``tiles = pack_tiles(weight)`` of a bf16 weight; None where the kernel does not apply
    (library not built here, another dtype or device, mismatched shapes, no rows).

    Products accumulate in float32, the bias is added in float32 and each output is rounded
    to bf16 once (nearest even), like torch's bf16 linear up to the order of the sums.
    """
    import torch

    return _tiles_rows("matvec_tiles_rows_bf16", torch.bfloat16, tiles, rows, bias)


def _tiles_rows(symbol: str, dtype: torch.dtype, tiles: torch.Tensor, rows: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor | None:
    """``rows (M, in) @ weight^T [+ bias]`` -> ``(M, out)`` in ``dtype`` from the tiles kernel
    ``symbol``, or None where it does not apply (not built, another dtype or device,
    mismatched shapes, no rows)."""
    import torch

    kernel = _rows_kernel(symbol)
    if (kernel is None or tiles.dtype != dtype or rows.dtype != dtype
            or tiles.dim() != 3 or rows.dim() != 2 or tiles.device.type != "cpu"
            or rows.device.type != "cpu" or not tiles.is_contiguous()):
        return None
    num_tiles, in_features, lanes = tiles.shape
    num_rows = rows.shape[0]
    if lanes != 8 or rows.shape[1] != in_features or num_rows == 0 or in_features == 0:
        return None
    if bias is not None and (bias.dtype != dtype or bias.shape != (num_tiles * 8,)
                             or not bias.is_contiguous() or bias.device.type != "cpu"):
        return None
    rows = rows.contiguous()
    out = torch.empty(num_rows, num_tiles * 8, dtype=dtype)  # (M, out)
    status = kernel(tiles.data_ptr(), rows.data_ptr(), None if bias is None else bias.data_ptr(),
                    out.data_ptr(), num_tiles * 8, in_features, num_rows, torch.get_num_threads())
    if status:
        raise RuntimeError(f"{symbol} failed with status {status}")
    return out


def pack_tiles_f16(weight: torch.Tensor) -> torch.Tensor:
    """:func:`pack_tiles` rounded to float16 (half the bytes; pure function).

    Raises:
        ValueError: A weight does not fit float16's range (it would become infinite).
    """
    import torch

    tiles = pack_tiles(weight).to(torch.float16)
    if not torch.isfinite(tiles).all():
        raise ValueError("weight values exceed float16's range")
    return tiles


def matvec_tiles_f16(tiles: torch.Tensor, row: torch.Tensor) -> torch.Tensor | None:
    """``weight @ row`` from ``tiles = pack_tiles_f16(weight)``, accumulated in float32 ->
    ``(out,)`` (approximate: the weight was rounded to float16), or None."""
    import torch

    if tiles.dtype != torch.float16:
        return None
    num_tiles, in_features, _ = tiles.shape
    return _run("matvec_tiles_f16", tiles, num_tiles * 8, in_features, row, None)


def greedy_screened_f16(tiles: torch.Tensor, weight: torch.Tensor, row: torch.Tensor,
                        scratch: torch.Tensor, bound_scale: float) -> tuple[int, int] | None:
    """``(token, candidates)``: the float32 argmax of ``weight @ row`` among the tokens whose
    float16-screened logit (``tiles = pack_tiles_f16(weight)``) is within
    ``2 * bound_scale * ||row||`` of the best one, and how many were rescored; None where the
    kernel is not built or no screened logit is finite. ``scratch``: ``(V,)`` float32."""
    import torch

    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    kernel = build.function(KERNEL, "greedy_screened_f16",
                            [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int, ptr],
                            restype=i64)
    if kernel is None or row.dtype != torch.float32:
        return None
    row = row.contiguous()
    count = ctypes.c_int64(0)
    token = kernel(tiles.data_ptr(), weight.data_ptr(), row.data_ptr(), scratch.data_ptr(),
                   weight.shape[0], weight.shape[1], bound_scale, torch.get_num_threads(),
                   ctypes.byref(count))
    if token == -2:
        raise ValueError(f"greedy_screened_f16: bad shapes {tuple(weight.shape)}")
    return None if token < 0 else (int(token), count.value)


def _run(symbol: str, weight: torch.Tensor, out_features: int, in_features: int,
         row: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    import torch

    kernel = _kernel(symbol)
    if kernel is None or row.dtype != torch.float32:
        return None
    row = row.contiguous()
    out = torch.empty(out_features, dtype=torch.float32)
    status = kernel(weight.data_ptr(), row.data_ptr(), None if bias is None else bias.data_ptr(),
                    out.data_ptr(), out_features, in_features, torch.get_num_threads())
    if status:
        raise RuntimeError(f"{symbol} failed with status {status}")
    return out
