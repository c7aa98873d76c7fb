"""De-quantization of the block formats read from GGUF files (``quant.formats.FILE_FORMATS``:
Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), bit for bit as ``gguf.quants.dequantize``.

``quant.formats`` owns the formats (their table, :class:`~langchain_ascend.quant.formats.
QuantizedWeight`, the layouts); this module only turns their bytes into float32 values, the
formulas of ``quant.formats``' docstring in gguf-py's float32 order: a scale times an integer,
then (``Q5_1``, ``Q4_K``, ``Q5_K``) plus or minus a second product, never fused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_ascend.errors import QuantizationError

if TYPE_CHECKING:
    import torch


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., 2)`` little-endian half floats -> float32 ``(...)``."""
    import torch

    return raw.contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., n)`` -> ``(..., 2, n)``: the low nibbles, then the high ones."""
    import torch

    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def k_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins packed in ``q4_k`` / ``q5_k``'s ``scales[12]`` (uint8
    ``(..., 12)``) -> two uint8 ``(..., 8)``: bytes 0..3 hold the low 6 bits of scales 0..3
    (top 2 bits: scales 4..7's high bits), 4..7 those of the mins, 8..11 the low nibbles of
    scales 4..7 and (high nibbles) of mins 4..7."""
    import torch

    low, mid, high = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([low & 0x3F, (high & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mid & 0x3F, (high >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return sc, mn


def _five_bits(qh: torch.Tensor) -> torch.Tensor:
    """``q5_0`` / ``q5_1``'s ``qh`` uint8 ``(..., 4)`` -> bit e of the little-endian uint32 as
    uint8 ``(..., 32)``."""
    import torch

    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh[..., :, None] >> shifts) & 1).reshape(*qh.shape[:-1], 32)  # byte e // 8, bit e % 8


def dequantize_blocks(fmt: str, raw: torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, B, bytes per block)`` blocks of ``fmt`` (one of ``formats.FILE_FORMATS``)
    -> float32 ``(N, B * values per block)``: the formulas of ``quant.formats``' docstring,
    the float32 products and sums in ``gguf.quants``' order (so bit for bit its values)."""
    import torch

    n, nb = raw.shape[0], raw.shape[1]
    if fmt in ("q5_0", "q5_1"):
        header = 2 if fmt == "q5_0" else 4
        d = _halves(raw[..., 0:2])[..., None]  # (N, B, 1)
        high = _five_bits(raw[..., header:header + 4])  # (N, B, 32)
        low = _nibbles(raw[..., header + 4:]).reshape(n, nb, 32)  # (N, B, 32)
        q = (low | (high << 4)).to(torch.float32)  # (N, B, 32)
        if fmt == "q5_0":
            values = d * (q - 16)
        else:
            values = d * q + _halves(raw[..., 2:4])[..., None]
    elif fmt in ("q4_k", "q5_k"):
        d, dmin = _halves(raw[..., 0:2])[..., None], _halves(raw[..., 2:4])[..., None]
        sc, mn = k_scales_mins(raw[..., 4:16])  # (N, B, 8) each
        scale = (d * sc.to(torch.float32))[..., None]  # (N, B, 8, 1)
        offset = (dmin * mn.to(torch.float32))[..., None]  # (N, B, 8, 1)
        qs = raw[..., -128:].reshape(n, nb, 4, 32)  # (N, B, 4 chunks, 32)
        q = _nibbles(qs).reshape(n, nb, 8, 32)  # sub-block 2c (low), 2c + 1 (high)
        if fmt == "q5_k":
            shifts = torch.arange(8, dtype=torch.uint8)[:, None]  # (8, 1)
            q = q | (((raw[..., 16:48][..., None, :] >> shifts) & 1) << 4)  # (N, B, 8, 32)
        values = scale * q.to(torch.float32) - offset  # (N, B, 8, 32)
    elif fmt == "q6_k":
        ql = raw[..., 0:128].reshape(n, nb, 2, 64)  # (N, B, half, 64)
        low = _nibbles(ql).reshape(n, nb, 2, 4, 32)  # group 4h + 2 (nibble) + (byte >= 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]  # (4, 1)
        qh = raw[..., 128:192].reshape(n, nb, 2, 1, 32)  # (N, B, half, 1, 32)
        q = (low | (((qh >> shifts) & 3) << 4)).to(torch.float32) - 32  # (N, B, 2, 4, 32)
        scales = raw[..., 192:208].contiguous().view(torch.int8).to(torch.float32)  # (N, B, 16)
        scale = _halves(raw[..., 208:210])[..., None] * scales  # (N, B, 16)
        values = scale[..., None] * q.reshape(n, nb, 16, 16)  # (N, B, 16, 16)
    else:
        raise QuantizationError(f"{fmt!r} is not a format read from files")
    return values.reshape(n, -1)  # (N, B * values)
