"""Block formats for quantized linear weights, byte for byte GGUF's blocks.

The 32-weight formats ``q4_0``, ``q4_1``, ``q8_0`` below, and beside them GGUF's ``Q5_0`` /
``Q5_1`` (32 weights) and the K-quants ``Q4_K`` / ``Q5_K`` / ``Q6_K`` (superblocks of 256
weights), section "Formats read from files" further down.

Every format cuts each weight row (one output feature) into blocks of :data:`BLOCK_SIZE` = 32
consecutive input weights and stores each block as a little-endian IEEE half-float scale
``d`` (``Q4_1``: then a half-float ``m``), then the quantized values:

========  =====================  =====  ====================================================
format    block                  bytes  weight ``j`` of the block
========  =====================  =====  ====================================================
``q4_0``  d, qs[16]              18     ``(q_j - 8) * d``; q_j = low nibble of qs[j] for
                                        j < 16, high nibble of qs[j - 16] for j >= 16
``q4_1``  d, m, qs[16]           20     ``q_j * d + m`` (nibbles as for ``q4_0``)
``q8_0``  d, qs[32] (int8)       34     ``qs[j] * d``
========  =====================  =====  ====================================================

A :class:`QuantizedWeight` holds a ``(out_features, in_features)`` weight as a uint8 tensor
``blocks`` of shape ``(out_features, in_features // 32 * bytes_per_block)``: the blocks of row
0, then row 1... -- exactly how a GGUF file stores a 2-D tensor of that type (GGUF lists the
shape as ``[in_features, out_features]``), so a GGUF tensor's raw bytes ARE ``blocks``.
Because each row is its own blocks, rows can be sliced, permuted or concatenated (fused q/k/v)
without touching a value.

:func:`quantize` follows the published reference rules (round to nearest per block; the same
arithmetic as ``gguf.quants.quantize``, tested bit for bit), :func:`dequantize` the published
de-quantization (the same float32 operations as ``gguf.quants.dequantize``).

Layouts (:data:`LAYOUTS`): ``"gguf"`` is the file's layout above. ``"x8"`` holds the very same
bytes re-laid for the native product (``native.qmatmul``): output rows in groups of 8, and
per group and block one *superblock* -- the 8 rows' scales (8 half floats), ``q4_1``: their
mins (8 half floats), then the values interleaved 4 inputs at a time, so that one 32-byte
load holds 4 inputs of all 8 rows:

* ``q4_0`` / ``q4_1``: 4 chunks of 32 bytes; chunk ``p`` = for each row ``r``, bytes
  ``4p..4p+3`` of that row's GGUF nibbles (low nibbles: inputs ``4p..4p+3``, high: inputs
  ``16+4p..16+4p+3``). 144 / 160 bytes per superblock.
* ``q8_0``: 8 chunks of 32 bytes; chunk ``g`` = for each row, its int8 values ``4g..4g+3``.
  272 bytes.
* the K-quants (:data:`K_X8_FORMATS`), per superblock of 256 inputs: each field of the block
  interleaved element by element (``quant.x8_fields``): ``q4_k`` d[8], dmin[8] (halves), then the
  packed 6-bit scales as 3 words x 8 rows, then ``qs`` as 32 words x 8 rows (word ``w`` of row
  ``r`` at ``32 w + 4 r``: bytes ``4w..4w+3``, low nibbles inputs ``4 (w % 8)..`` of
  sub-block ``2 (w // 8)``, high nibbles of the next sub-block), 1152 bytes; ``q5_k`` the same
  with ``qh`` as 8 words x 8 rows before ``qs``, 1408 bytes; ``q6_k`` d[8], the 16 int8
  scales byte by byte (scale ``i`` of row ``r`` at ``16 + 8 i + r``), then in 8-word x 8-row
  chunks of 256 bytes ``ql`` words 0..7, ``qh`` words 0..7, ``ql`` words 8..15, ``ql``
  16..23, ``qh`` 8..15, ``ql`` 24..31 (the order the product reads them), 1680 bytes.

An ``x8`` weight needs ``out_features % 8 == 0``; its ``blocks`` have the shape ``(N / 8,
8 * K/32 * bytes_per_block)``, one row per group of 8 output rows (the same bytes in memory
as the file's rows ``8G..8G+7``; the other shape keeps code that slices rows as if they were
the file's from silently misreading it), so slicing or concatenating whole groups stays
exact (:func:`rows`, :func:`concatenate`). :func:`to_layout` converts both ways (a
permutation of bytes).

Formats read from files (:data:`FILE_FORMATS`: the file's ``"gguf"`` layout, the K-quants
``"x8"`` too; no
:func:`quantize`; :func:`dequantize` as ``gguf.quants.dequantize``, bit for bit). All scales
are little-endian half floats; ``e`` is the weight's index in its block / sub-block:

========  ======  =====  ==================================================================
format    values  bytes  block and weight
========  ======  =====  ==================================================================
``q5_0``  32      22     d, qh (uint32), qs[16]: ``(q - 16) * d``, q = nibble (as ``q4_0``)
                         ``| bit e of qh << 4``
``q5_1``  32      24     d, m, qh, qs[16]: ``q * d + m`` (q as ``q5_0``)
``q4_k``  256     144    d, dmin, scales[12], qs[128]: 8 sub-blocks j of 32, 6-bit scale
                         ``sc_j`` and min ``m_j`` packed in ``scales``; sub-block j's q =
                         nibble ``j % 2`` (low, high) of ``qs[32 (j // 2) + e]``;
                         ``(d * sc_j) * q - dmin * m_j``
``q5_k``  256     176    d, dmin, scales[12], qh[32], qs[128]: as ``q4_k``, q ``|=`` bit j of
                         ``qh[e]`` ``<< 4``
``q6_k``  256     210    ql[128], qh[64], scales[16] (int8), d: 16 sub-blocks of 16; 32-group
                         ``g = 4h + k`` (h 0..1, k 0..3): q = nibble ``k // 2`` of ``ql[64h +
                         32 (k % 2) + e]`` ``| ((qh[32h + e] >> 2k) & 3) << 4``;
                         ``(d * scales[2g + e // 16]) * (q - 32)``
========  ======  =====  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_ascend.errors import QuantizationError
from langchain_ascend.native import block_layout
from langchain_ascend.quant.file_blocks import dequantize_blocks
from langchain_ascend.quant.x8_fields import block_dtypes, field_table

if TYPE_CHECKING:
    import torch

BLOCK_SIZE = 32
"""Weights per block of the 32-weight formats, and per activation block of the products."""
SUPERBLOCK_SIZE = 256
"""Weights per superblock of the K-quants (``q4_k``, ``q5_k``, ``q6_k``)."""
X8_FORMATS = ("q4_0", "q4_1", "q8_0")
"""Formats :func:`quantize` writes (one scale per 32 values; the ``"x8"`` layout takes them)."""
FILE_FORMATS = ("q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
"""Formats read from GGUF files as they are (no :func:`quantize`)."""
K_X8_FORMATS = ("q4_k", "q5_k", "q6_k")
"""The K-quants the ``"x8"`` layout takes too (module docstring)."""
X8_LAYOUT_FORMATS = X8_FORMATS + K_X8_FORMATS
"""Every format the ``"x8"`` layout takes."""
FORMATS = X8_FORMATS + FILE_FORMATS
"""The supported formats."""
_BYTES_PER_BLOCK = {"q4_0": 2 + BLOCK_SIZE // 2, "q4_1": 4 + BLOCK_SIZE // 2, "q8_0": 2 + BLOCK_SIZE,
                    "q5_0": 22, "q5_1": 24, "q4_k": 144, "q5_k": 176, "q6_k": 210}
_VALUES_PER_BLOCK = {"q4_k": SUPERBLOCK_SIZE, "q5_k": SUPERBLOCK_SIZE, "q6_k": SUPERBLOCK_SIZE}
_HEADER_BYTES = {"q4_0": 2, "q4_1": 4, "q8_0": 2}
GGML_TYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 8, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13,
              "q6_k": 14}
"""GGML's type id of each format (``gguf.GGMLQuantizationType``), for readers of GGUF files."""
LAYOUTS = ("gguf", "x8")
"""Byte layouts of ``blocks`` (module docstring)."""
ROWS_PER_GROUP = 8
"""Output rows per group of the ``"x8"`` layout."""


def check_format(fmt: object) -> str:
    """``fmt`` when it is one of :data:`FORMATS`.

    Raises:
        QuantizationError: Any other value.
    """
    if not isinstance(fmt, str) or fmt not in _BYTES_PER_BLOCK:
        raise QuantizationError(f"unknown quantized format {fmt!r}: expected one of {FORMATS}")
    return fmt


def block_size(fmt: str) -> int:
    """Weights per block of ``fmt``: 32, or 256 for the K-quants.

    Raises:
        QuantizationError: ``fmt`` is not one of :data:`FORMATS`.
    """
    return _VALUES_PER_BLOCK.get(check_format(fmt), BLOCK_SIZE)


def bytes_per_block(fmt: str) -> int:
    """Bytes of one block of :func:`block_size` weights in ``fmt`` (18, 20, 34; 22, 24; 144,
    176, 210).

    Raises:
        QuantizationError: ``fmt`` is not one of :data:`FORMATS`.
    """
    return _BYTES_PER_BLOCK[check_format(fmt)]


def header_bytes(fmt: str) -> int:
    """Bytes before the quantized values in a block of an :data:`X8_FORMATS` format: the scale
    (and min)."""
    if check_format(fmt) not in _HEADER_BYTES:
        raise QuantizationError(f"{fmt}: no x8 header (formats {X8_FORMATS} only)")
    return _HEADER_BYTES[fmt]


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A linear weight ``(out_features, in_features)`` in one block format, as GGUF lays it out.

    Attributes:
        fmt: One of :data:`FORMATS`.
        out_features: Rows of the weight (N).
        in_features: Columns of the weight (K), a multiple of :func:`block_size`.
        blocks: uint8 ``(N, K // block_size(fmt) * bytes_per_block(fmt))``, contiguous, on the CPU for the
            native kernels: in the ``"gguf"`` layout row n holds the blocks of weights
            ``W[n, 0:32]``, ``W[n, 32:64]``...; in the ``"x8"`` layout ``(N / 8, 8 * K // 32
            * bytes_per_block(fmt))``, one row per group of 8 output rows.
        layout: ``"gguf"`` (default) or ``"x8"`` (module docstring).

    Raises:
        QuantizationError: On construction, when the format or layout is unknown, ``K`` is
            not a multiple of 32, ``blocks`` has another dtype, rank or shape, or an ``"x8"``
            weight has ``N % 8 != 0``.
    """

    fmt: str
    out_features: int
    in_features: int
    blocks: torch.Tensor
    layout: str = "gguf"

    def __post_init__(self) -> None:
        import torch

        per_block = bytes_per_block(self.fmt)
        n, k = self.out_features, self.in_features
        if not isinstance(n, int) or not isinstance(k, int) or n < 1 or k < 1:
            raise QuantizationError(f"{self.fmt}: out_features and in_features must be positive "
                                    f"ints, got ({n!r}, {k!r})")
        _check_width(self.fmt, k)
        if self.layout not in LAYOUTS:
            raise QuantizationError(f"unknown block layout {self.layout!r}: expected one of "
                                    f"{LAYOUTS}")
        if self.layout == "x8" and self.fmt not in X8_LAYOUT_FORMATS:
            raise QuantizationError(f"{self.fmt}: the x8 layout takes {X8_LAYOUT_FORMATS} only")
        if self.layout == "x8" and n % ROWS_PER_GROUP:
            raise QuantizationError(f"{self.fmt}: the x8 layout needs out_features % 8 == 0, "
                                    f"got {n}")
        if not isinstance(self.blocks, torch.Tensor) or self.blocks.dtype != torch.uint8:
            got = getattr(self.blocks, "dtype", type(self.blocks).__name__)
            raise QuantizationError(f"{self.fmt}: blocks must be a uint8 tensor, got {got}")
        want = (n, k // block_size(self.fmt) * per_block)
        if self.layout == "x8":
            want = (n // ROWS_PER_GROUP, ROWS_PER_GROUP * want[1])
        if tuple(self.blocks.shape) != want:
            raise QuantizationError(f"{self.fmt}: blocks of a ({n}, {k}) weight must have shape "
                                    f"{want}, got {tuple(self.blocks.shape)}")

    @property
    def blocks_per_row(self) -> int:
        """Blocks in one row (``in_features // block_size(fmt)``)."""
        return self.in_features // block_size(self.fmt)

    @property
    def shape(self) -> tuple[int, int]:
        """``(out_features, in_features)``, as the float weight's."""
        return (self.out_features, self.in_features)


def nbytes(qw: QuantizedWeight) -> int:
    """Bytes of ``qw``'s blocks (what a product streams)."""
    return qw.out_features * qw.blocks_per_row * bytes_per_block(qw.fmt)


def _check_width(fmt: str, in_features: int) -> None:
    size = block_size(fmt)
    if in_features % size:
        raise QuantizationError(f"{fmt}: in_features must be a multiple of {size}, got "
                                f"{in_features}")


def _float_blocks(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight (N, K)`` as float32 ``(N, K/32, 32)`` blocks, after checking it."""
    import torch

    if not isinstance(weight, torch.Tensor):
        raise QuantizationError(f"{fmt}: expected a tensor, got {type(weight).__name__}")
    if not weight.is_floating_point():
        raise QuantizationError(f"{fmt}: expected a floating-point weight, got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise QuantizationError(f"{fmt}: expected a non-empty 2-D (out_features, in_features) "
                                f"weight, got shape {tuple(weight.shape)}")
    _check_width(fmt, weight.shape[1])
    rows, width = weight.shape
    x = weight.detach().to(device="cpu", dtype=torch.float32)  # (N, K), exact for bf16/fp16
    return x.reshape(rows, width // BLOCK_SIZE, BLOCK_SIZE)  # (N, B, 32)


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 ``(..., 1)`` rounded to IEEE half (nearest even) as ``(..., 2)`` little-endian
    bytes."""
    import torch

    return values.to(torch.float16).view(torch.uint8)  # (..., 2)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., 32)`` values 0..15 -> ``(..., 16)``: element j low, element j+16 high."""
    return q[..., :16] | (q[..., 16:] << 4)  # (..., 16)


def _reciprocal(d: torch.Tensor) -> torch.Tensor:
    """``1 / d``, and 0 where ``d == 0`` (the reference's ``id``)."""
    import torch

    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round to nearest, halves away from zero (C's ``roundf``), in the reference's steps:
    ``sign(v) * (floor(|v|) + floor(2 * (|v| - floor(|v|))))``."""
    import torch

    a = v.abs()
    floored = torch.floor(a)
    return torch.sign(v) * (floored + torch.floor(2 * (a - floored)))


def quantize(weight: torch.Tensor, fmt: str) -> QuantizedWeight:
    """``weight (N, K)`` rounded to nearest per block of 32 into ``fmt``.

    The published reference rules, step for step in float32: ``q4_0``: ``d = v / -8`` where
    ``v`` is the block's value of largest magnitude (the first such), ``q = min(15, trunc(x /
    d + 8.5))``; ``q4_1``: ``d = (max - min) / 15``, ``m = min``, ``q = min(15, trunc((x - m)
    / d + 0.5))``; ``q8_0``: ``d = max|x| / 127``, ``q = roundf(x / d)`` (``x / d`` is ``x *
    (1 / d)``, and 0 for an all-zero block). The scales (and mins) are stored as half floats.

    Args:
        weight: Floating-point ``(out_features, in_features)``, any device (quantized on the
            CPU), ``in_features`` a multiple of 32.
        fmt: One of :data:`X8_FORMATS`.

    Raises:
        QuantizationError: Unknown format or one of :data:`FILE_FORMATS` (read from files,
            not written here), a weight that is not floating point or not 2-D, or
            ``in_features`` not a multiple of 32.
    """
    import torch

    if check_format(fmt) not in X8_FORMATS:
        raise QuantizationError(f"{fmt}: blocks of this format are read from GGUF files, not "
                                f"quantized here (quantize writes {X8_FORMATS})")
    x = _float_blocks(weight, fmt)  # (N, B, 32)
    rows, num_blocks, _ = x.shape
    if fmt == "q4_0":
        largest = x.abs().argmax(dim=-1, keepdim=True)  # (N, B, 1), first on ties
        d = x.gather(-1, largest) / -8  # (N, B, 1)
        q = torch.trunc(x * _reciprocal(d) + 8.5).clamp_(0, 15).to(torch.uint8)  # (N, B, 32)
        parts = [_half_bytes(d), _pack_nibbles(q)]
    elif fmt == "q4_1":
        high = x.amax(dim=-1, keepdim=True)  # (N, B, 1)
        low = x.amin(dim=-1, keepdim=True)  # (N, B, 1)
        d = (high - low) / 15  # (N, B, 1)
        q = torch.trunc((x - low) * _reciprocal(d) + 0.5).clamp_(0, 15).to(torch.uint8)
        parts = [_half_bytes(d), _half_bytes(low), _pack_nibbles(q)]  # q: (N, B, 32)
    else:
        d = x.abs().amax(dim=-1, keepdim=True) / 127  # (N, B, 1)
        q = _round_half_away(x * _reciprocal(d)).to(torch.int8)  # (N, B, 32)
        parts = [_half_bytes(d), q.view(torch.uint8)]
    blocks = torch.cat(parts, dim=-1)  # (N, B, bytes_per_block)
    return QuantizedWeight(fmt, rows, num_blocks * BLOCK_SIZE,
                           blocks.reshape(rows, -1).contiguous())  # (N, B * bytes_per_block)


def unpack(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The integer values and float32 scales of ``qw`` (pure function; for references).

    Returns:
        ``(q, d, m)``: ``q`` int16 ``(N, B, 32)`` as stored (0..15 for the 4-bit formats,
        -128..127 for ``q8_0``), ``d`` float32 ``(N, B)``, ``m`` float32 ``(N, B)`` for
        ``q4_1`` else None.

    Raises:
        QuantizationError: A weight of :data:`FILE_FORMATS` (whose scales are not one per 32
            values: use :func:`dequantize`).
    """
    import torch

    if qw.fmt not in X8_FORMATS:
        raise QuantizationError(f"unpack: {qw.fmt} blocks have no (q, d, m) per 32 values; "
                                f"use dequantize")
    qw = to_layout(qw, "gguf")
    per_block, header = bytes_per_block(qw.fmt), header_bytes(qw.fmt)
    raw = qw.blocks.reshape(qw.out_features, qw.blocks_per_row, per_block)  # (N, B, bytes)
    d = raw[..., 0:2].contiguous().view(torch.float16)[..., 0].float()  # (N, B)
    m = None
    if qw.fmt == "q4_1":
        m = raw[..., 2:4].contiguous().view(torch.float16)[..., 0].float()  # (N, B)
    values = raw[..., header:]  # (N, B, 16) nibbles or (N, B, 32) int8
    if qw.fmt == "q8_0":
        q = values.contiguous().view(torch.int8).to(torch.int16)  # (N, B, 32)
    else:
        q = torch.cat([values & 0x0F, values >> 4], dim=-1).to(torch.int16)  # (N, B, 32)
    return q, d, m


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """``qw`` as a float32 ``(out_features, in_features)`` weight: ``(q - 8) * d``, ``q * d +
    m`` (a product, then a sum: two roundings) or ``q * d`` -- the same float32 operations
    as ``gguf.quants.dequantize``, so the values are equal bit for bit (:data:`FILE_FORMATS`:
    the module docstring's formulas, in ``gguf.quants``' float32 order)."""
    import torch

    if qw.fmt in FILE_FORMATS:
        qw = to_layout(qw, "gguf")
        raw = qw.blocks.reshape(qw.out_features, qw.blocks_per_row, bytes_per_block(qw.fmt))
        return dequantize_blocks(qw.fmt, raw).reshape(qw.shape)  # (N, K)
    q, d, m = unpack(qw)  # (N, B, 32), (N, B), (N, B)
    if qw.fmt == "q4_0":
        values = d[..., None] * (q - 8).to(torch.float32)  # (N, B, 32)
    elif qw.fmt == "q4_1":
        assert m is not None
        values = d[..., None] * q.to(torch.float32)  # (N, B, 32)
        values = values + m[..., None]
    else:
        values = q.to(torch.float32) * d[..., None]  # (N, B, 32)
    return values.reshape(qw.out_features, qw.in_features)  # (N, K)


def concatenate(weights: list[QuantizedWeight], layout: str | None = None) -> QuantizedWeight:
    """The weights stacked along output features (fused q/k/v, gate/up): exact, since every
    row (``"x8"``: every group of 8 rows) is its own blocks. ``layout``: the result's (each
    weight re-laid straight into its place, :func:`to_layout`); default the weights' own,
    which must then be one.

    Raises:
        QuantizationError: No weights; formats or input widths that differ; layouts that
            differ without ``layout``; ``"x8"`` with a weight of ``out_features % 8 != 0``.
    """
    import torch

    if not weights:
        raise QuantizationError("concatenate: no weights")
    first = weights[0]
    for other in weights[1:]:
        if (other.fmt, other.in_features) != (first.fmt, first.in_features) or (
                layout is None and other.layout != first.layout):
            raise QuantizationError(
                f"concatenate: every weight must share format, layout and in_features, got "
                f"{first.fmt}/{first.layout} ({first.in_features}) and "
                f"{other.fmt}/{other.layout} ({other.in_features})")
    layout = first.layout if layout is None else layout
    total = sum(w.out_features for w in weights)
    if layout == "gguf" and all(w.layout == "gguf" for w in weights):
        blocks = torch.cat([w.blocks for w in weights]).contiguous()  # (sum N, bytes per row)
        return QuantizedWeight(first.fmt, total, first.in_features, blocks, layout)
    if layout not in LAYOUTS:
        raise QuantizationError(f"unknown block layout {layout!r}: expected one of {LAYOUTS}")
    group = ROWS_PER_GROUP if layout == "x8" else 1
    if any(w.out_features % group for w in weights):
        raise QuantizationError(f"concatenate: the x8 layout needs out_features % 8 == 0, got "
                                f"{[w.out_features for w in weights]}")
    row_bytes = group * first.blocks_per_row * bytes_per_block(first.fmt)
    blocks = torch.empty(total // group, row_bytes, dtype=torch.uint8)  # (sum N / group, bytes)
    start = 0
    for weight in weights:
        stop = start + weight.out_features // group
        to_layout(weight, layout, out=blocks[start:stop])
        start = stop
    return QuantizedWeight(first.fmt, total, first.in_features, blocks, layout)


def rows(qw: QuantizedWeight, start: int, stop: int) -> QuantizedWeight:
    """Output rows ``start:stop`` of ``qw`` as a view of its blocks (``"x8"``: multiples of 8).

    Raises:
        QuantizationError: Bounds outside the weight, or not whole groups of an ``"x8"``
            weight.
    """
    if not 0 <= start < stop <= qw.out_features or (
            qw.layout == "x8" and (start % ROWS_PER_GROUP or stop % ROWS_PER_GROUP)):
        raise QuantizationError(f"rows {start}:{stop} of a {qw.shape} {qw.layout} weight")
    if qw.layout == "x8":
        start, stop = start // ROWS_PER_GROUP, stop // ROWS_PER_GROUP
    return QuantizedWeight(qw.fmt, (stop - start) * (ROWS_PER_GROUP if qw.layout == "x8" else 1),
                           qw.in_features, qw.blocks[start:stop], qw.layout)


def to_layout(qw: QuantizedWeight, layout: str,
              out: torch.Tensor | None = None) -> QuantizedWeight:
    """``qw`` in ``layout`` (``qw`` itself when already there and no ``out`` is given; else a
    re-laid copy of the same bytes, on the CPU).

    Args:
        qw: The weight.
        layout: One of :data:`LAYOUTS`.
        out: Where to write the re-laid blocks (a contiguous uint8 CPU tensor of the result's
            ``blocks`` shape, e.g. a slice of a fused weight's); default a new tensor.

    Raises:
        QuantizationError: An unknown layout, ``"x8"`` for ``out_features % 8 != 0``, or an
            ``out`` of another shape.
    """
    import torch

    if layout not in LAYOUTS:
        raise QuantizationError(f"unknown block layout {layout!r}: expected one of {LAYOUTS}")
    if layout == qw.layout:
        if out is None:
            return qw
        out.copy_(qw.blocks)
        return QuantizedWeight(qw.fmt, qw.out_features, qw.in_features, out, layout)
    if qw.out_features % ROWS_PER_GROUP:
        raise QuantizationError(f"{qw.fmt}: the x8 layout needs out_features % 8 == 0, got "
                                f"{qw.out_features}")
    if qw.fmt not in X8_LAYOUT_FORMATS:
        raise QuantizationError(f"{qw.fmt}: the x8 layout takes {X8_LAYOUT_FORMATS} only")
    per_block = bytes_per_block(qw.fmt)
    groups, num_blocks = qw.out_features // ROWS_PER_GROUP, qw.blocks_per_row
    row, superblock = block_dtypes(qw.fmt, ROWS_PER_GROUP)
    want = ((groups, ROWS_PER_GROUP * num_blocks * per_block) if layout == "x8"
            else (qw.out_features, num_blocks * per_block))
    blocks = torch.empty(want, dtype=torch.uint8) if out is None else out
    if tuple(blocks.shape) != want or blocks.dtype != torch.uint8 or not blocks.is_contiguous():
        raise QuantizationError(f"{qw.fmt}: out must be a contiguous uint8 tensor of shape "
                                f"{want}, got {tuple(blocks.shape)} {blocks.dtype}")
    source = qw.blocks.detach().cpu()
    if layout == "x8" and block_layout.x8_from_rows(
            source, blocks, block_bytes=per_block, fields=field_table(qw.fmt)):
        pass  # the native pass wrote the bytes of the numpy re-laying below
    elif layout == "x8":  # (G, 8, B) row blocks -> (G, B) superblocks
        rows_in = source.contiguous().numpy().view(row).reshape(groups, ROWS_PER_GROUP, -1)
        grouped = blocks.numpy().view(superblock).reshape(groups, num_blocks)
        for field in row.names:
            grouped[field] = rows_in[field].transpose(0, 2, 3, 1)  # (G, B, count, 8)
    else:  # (G, B) superblocks -> (G, 8, B) row blocks
        grouped = source.contiguous().numpy().view(superblock).reshape(groups, num_blocks)
        rows_out = blocks.numpy().view(row).reshape(groups, ROWS_PER_GROUP, num_blocks)
        for field in row.names:
            rows_out[field] = grouped[field].transpose(0, 3, 1, 2)  # (G, 8, B, count)
    shape = (groups, -1) if layout == "x8" else (qw.out_features, -1)
    return QuantizedWeight(qw.fmt, qw.out_features, qw.in_features,
                           blocks.reshape(shape).contiguous(), layout)

