"""Products with quantized weights (GGUF blocks, every ``quant.formats`` format) on the CPU.

:func:`qmatmul` computes ``x (M, K) @ W^T [+ bias]`` -> ``(M, N)`` float32 from a
:class:`~langchain_ascend.quant.formats.QuantizedWeight` as it is (``qmatmul.c``): each row of
``x`` is quantized to int8 per block of 32 (``d = max|x| / 127``), every block of the weight is
read once per call for all rows, the 32-pair dot products are integers, and the per-block
scales are applied in float32. Any ``M``: decode batches of 1..64 rows cost little more than
one row (the weights are read once), prefills run in blocks of 64 rows. Both block layouts
run (``quant.formats.LAYOUTS``): the file's own, and ``"x8"`` (the same bytes interleaved by 8
output rows, :func:`pack`), about twice as fast on AVX2 (one load holds 4 inputs of 8 rows;
measurements in ``docs/performance.md``). The two layouts sum the same integers in a
different float order, so a weight gives one set of bits per layout.

A row's result does not depend on the other rows of the call, nor on the threads or the
instruction set (scalar C, AVX2, AVX-VNNI, AVX512-VNNI all give the same bits): the engine's
greedy output is the same batched or solo. The variant is chosen once from the CPU's flags in
``/proc/cpuinfo`` (:func:`choose_variant`; AVX2 at least, the native library is not built
without it); where the library is not built, :func:`qmatmul` runs :func:`reference_qmatmul`,
the same arithmetic in torch (equal up to the order of float sums), so every host computes
the same thing.

The formats read from files (``quant.formats.FILE_FORMATS``) run in the file's layout: ``q5_0``
/ ``q5_1`` as ``q4_0`` / ``q4_1`` with a fifth bit, the K-quants ``q4_k`` / ``q5_k`` / ``q6_k``
per superblock of 256 weights against the same int8 activation blocks of 32 (llama.cpp
quantizes K-quant activations per 256 instead, ``Q8_K``; per 32 keeps each block's own scale,
and costs nothing at batch 1, where the weights' bytes bound the product): per 32-weight group
the exact integer dot product times the group's integer scale, the float32 scales applied per
group in 8 lanes (``qmatmul_ktiles.h``). The K-quants also run in ``"x8"`` (:func:`pack`; the
engine re-lays them at load): 8 output rows per vector lane as for ``q4_0``, the scales
expanded to float32 once per superblock of 8 rows and every unpacked weight vector applied to
all rows of the call (``qmatmul_k8.h``), 1.5-2x the file layout's speed (``docs/performance.md``).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import QuantizationError
from langchain_ascend.native import build
from langchain_ascend.quant.formats import (
    BLOCK_SIZE,
    FILE_FORMATS,
    X8_LAYOUT_FORMATS,
    QuantizedWeight,
    check_format,
    dequantize,
    to_layout,
    unpack,
)

if TYPE_CHECKING:
    import torch

KERNEL = "qmatmul"
FORMAT_CODES = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "q5_0": 3, "q5_1": 4, "q4_k": 5, "q5_k": 6,
                "q6_k": 7}
"""The kernel's format argument."""
LAYOUT_CODES = {"gguf": 0, "x8": 1}
"""The kernel's layout argument (``quant.formats.LAYOUTS``)."""
VARIANTS = ("scalar", "avx2", "avxvnni", "avx512vnni")
"""The kernel's instruction-set variants, by code (index)."""
VARIANT_ENV_VAR = "LANGCHAIN_ASCEND_QMATMUL_VARIANT"
"""Forces one of :data:`VARIANTS` (for measurements and tests); unset: :func:`choose_variant`."""
_STATUS = {2: "bad shapes", 3: "out of memory", 4: "unknown format or variant",
           5: "instructions this CPU does not have"}


def _kernel() -> Any:
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    return build.function(KERNEL, "qmatmul", [c_int, c_int, c_int, ptr, i64, i64, ptr, c_int,
                                              i64, i64, ptr, ptr, c_int])


def available() -> bool:
    """Whether the native kernel is built and loaded here (builds it on first call)."""
    return _kernel() is not None


def choose_variant(flags: set[str] | frozenset[str]) -> str:
    """The fastest variant for a CPU with these ``/proc/cpuinfo`` flags (pure function):
    ``"avx512vnni"`` where ``avx512_vnni`` and ``avx512vl`` are listed, else ``"avxvnni"``
    where ``avx_vnni`` is, else ``"avx2"``. (The VNNI variants do in one instruction what AVX2
    does in two, and the AVX512 one multiplies an ``"x8"`` weight 16 output rows per 512-bit
    instruction: about 1.8x the 256-bit ``"avxvnni"`` at 16-64 rows on a Zen 5 host, whose
    512-bit units are full width. None of them uses AMX, which some VMs list but trap.)"""
    if {"avx512_vnni", "avx512vl"} <= flags:
        return "avx512vnni"
    if "avx_vnni" in flags:
        return "avxvnni"
    return "avx2"


@functools.lru_cache(maxsize=1)
def kernel_variant() -> str:
    """The variant :func:`qmatmul` runs in this process: :data:`VARIANT_ENV_VAR` when set,
    else :func:`choose_variant` of this CPU's flags (checked by the kernel: a variant the CPU
    lacks falls back to ``"avx2"``).

    Raises:
        QuantizationError: :data:`VARIANT_ENV_VAR` names no variant.
    """
    forced = os.environ.get(VARIANT_ENV_VAR, "").strip()
    if forced and forced not in VARIANTS:
        raise QuantizationError(f"{VARIANT_ENV_VAR}={forced!r}: expected one of {VARIANTS}")
    chosen = forced or choose_variant(build.cpu_flags())
    if not supported(chosen):
        return "avx2"
    return chosen


def kernel_name() -> str:
    """What :func:`qmatmul` runs here, e.g. ``"qmatmul avx2"`` or ``"torch reference"``."""
    return f"qmatmul {kernel_variant()}" if available() else "torch reference"


def supported(variant: str) -> bool:
    """Whether the native kernel is built and this CPU runs ``variant``."""
    fn = build.function(KERNEL, "qmatmul_supported", [ctypes.c_int])
    return fn is not None and variant in VARIANTS and bool(fn(VARIANTS.index(variant)))


def _check(x: Any, qw: Any, bias: Any, out: Any) -> None:
    """Raise :class:`QuantizationError` unless the arguments fit :func:`qmatmul`."""
    import torch

    if not isinstance(qw, QuantizedWeight):
        raise QuantizationError(f"qmatmul: expected a QuantizedWeight, got {type(qw).__name__}")
    check_format(qw.fmt)
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16):
        got = getattr(x, "dtype", type(x).__name__)
        raise QuantizationError(f"qmatmul: x must be a float32 or bfloat16 tensor, got {got}")
    if x.dim() != 2 or x.shape[1] != qw.in_features:
        raise QuantizationError(f"qmatmul: x must have shape (M, {qw.in_features}) for a "
                                f"{qw.shape} {qw.fmt} weight, got {tuple(x.shape)}")
    if x.device.type != "cpu" or qw.blocks.device.type != "cpu":
        raise QuantizationError(f"qmatmul runs on the CPU: x on {x.device}, blocks on "
                                f"{qw.blocks.device}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1
                             or bias.shape[0] != qw.out_features or not bias.is_floating_point()
                             or bias.device.type != "cpu"):
        raise QuantizationError(f"qmatmul: bias must be a floating-point CPU tensor of shape "
                                f"({qw.out_features},), got "
                                f"{getattr(bias, 'shape', type(bias).__name__)}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
                            or tuple(out.shape) != (x.shape[0], qw.out_features)
                            or not out.is_contiguous() or out.device.type != "cpu"):
        raise QuantizationError(f"qmatmul: out must be a contiguous float32 CPU tensor of shape "
                                f"({x.shape[0]}, {qw.out_features}), got "
                                f"{getattr(out, 'shape', type(out).__name__)}")


def qmatmul(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``x (M, K) @ W^T [+ bias]`` -> ``(M, N)`` float32, ``W`` given as GGUF blocks.

    Args:
        x: float32 or bfloat16 ``(M, K)`` on the CPU (rows may be strided).
        qw: The weight ``(N, K)``.
        bias: Optional ``(N,)`` (added in float32).
        out: Optional contiguous float32 ``(M, N)`` to write into (returned).

    Returns:
        ``(M, N)`` float32. Without the native kernel: :func:`reference_qmatmul`.

    Raises:
        QuantizationError: A weight that is not a :class:`QuantizedWeight`, ``x`` of another
            dtype, rank, width or device, a bias or ``out`` of the wrong shape or dtype.
    """
    import torch

    _check(x, qw, bias, out)
    rows = x.shape[0]
    if out is None:
        out = torch.empty(rows, qw.out_features, dtype=torch.float32)  # (M, N)
    if rows == 0:
        return out
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()  # (N,)
    kernel = _kernel()
    if kernel is None:
        return out.copy_(reference_qmatmul(x, qw, bias32))
    if x.stride(1) != 1 or x.stride(0) < x.shape[1]:
        x = x.contiguous()  # (M, K)
    blocks = qw.blocks if qw.blocks.is_contiguous() else qw.blocks.contiguous()
    status = kernel(FORMAT_CODES[qw.fmt], LAYOUT_CODES[qw.layout],
                    VARIANTS.index(kernel_variant()), blocks.data_ptr(),
                    qw.out_features, qw.in_features, x.data_ptr(),
                    0 if x.dtype == torch.float32 else 1, x.stride(0), rows,
                    None if bias32 is None else bias32.data_ptr(), out.data_ptr(),
                    torch.get_num_threads())
    if status:
        raise RuntimeError(f"qmatmul kernel failed with status {status} "
                           f"({_STATUS.get(status, 'unknown')})")
    return out


def pack(qw: QuantizedWeight) -> QuantizedWeight:
    """``qw`` in the faster ``"x8"`` layout where it can be (``quant.formats.X8_LAYOUT_FORMATS``,
    ``out_features % 8 == 0``), else ``qw`` itself (pure function; the same bytes re-laid,
    ``quant.formats.to_layout``)."""
    if qw.layout == "x8" or qw.out_features % 8 or qw.fmt not in X8_LAYOUT_FORMATS:
        return qw
    return to_layout(qw, "x8")


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (M, K)`` quantized per block of 32 as :func:`qmatmul` does (pure function).

    Returns:
        ``(q, d)``: ``q`` int8 ``(M, K / 32, 32)`` = round-half-even(x * (1 / d)) (0 where
        ``d == 0``), ``d`` float32 ``(M, K / 32)`` = max|x| / 127 per block.
    """
    import torch

    rows, width = x.shape
    blocks = x.to(torch.float32).reshape(rows, width // BLOCK_SIZE, BLOCK_SIZE)  # (M, B, 32)
    d = blocks.abs().amax(dim=-1) / 127  # (M, B)
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)  # (M, B)
    q = torch.round(blocks * inverse[..., None]).to(torch.int8)  # (M, B, 32), half to even
    return q, d


def reference_qmatmul(x: torch.Tensor, qw: QuantizedWeight,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """The arithmetic of :func:`qmatmul` in torch: the same int8 activations and exact integer
    dot products per block, the scales applied in float32 -> ``(M, N)`` float32 (equal to
    the kernel up to the order of the float sums; the portable path where the native kernel
    is not built)."""
    import torch

    _check(x, qw, bias, None)
    q_a, d_a = quantize_activations(x)  # (M, B, 32), (M, B)
    if qw.fmt in FILE_FORMATS:
        # The same int8 activations times the de-quantized weight (its values are the
        # kernel's scale times integer up to one float32 rounding), the sums in float64.
        x_hat = (q_a.to(torch.float64) * d_a.to(torch.float64)[..., None]).flatten(1)  # (M, K)
        out = (x_hat @ dequantize(qw).to(torch.float64).t()).to(torch.float32)  # (M, N)
        return out if bias is None else out + bias.to(torch.float32)
    q_w, d_w, m_w = unpack(qw)  # (N, B, 32), (N, B), (N, B)
    if qw.fmt == "q4_0":
        q_w = q_w - 8
    # Integer dot products per block, exact in float32 (|sum| <= 32 * 128 * 127 < 2**24).
    dots = torch.einsum("mbk,nbk->mnb", q_a.to(torch.float32), q_w.to(torch.float32))  # (M,N,B)
    scales = d_a[:, None, :] * d_w[None, :, :]  # (M, N, B)
    out = (dots * scales).sum(dim=-1)  # (M, N)
    if m_w is not None:
        sums = d_a * q_a.to(torch.float32).sum(dim=-1)  # (M, B): d_a * sum(q_a)
        out = out + sums @ m_w.t()  # (M, N)
    if bias is not None:
        out = out + bias.to(torch.float32)  # (M, N)
    return out
