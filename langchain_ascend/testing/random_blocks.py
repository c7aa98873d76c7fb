"""Random GGUF blocks of a block type, for tests, test files and measurements.

Any bytes make a valid block of a GGUF block type once its half-float scales are finite, so a
random block is random bytes with its scales overwritten by small finite values: every nibble,
fifth / sixth bit and packed 6-bit sub-scale pattern comes up. Pure functions of their
arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_ascend.quant import formats

if TYPE_CHECKING:
    import torch

SCALE_OFFSETS = {"q4_0": (0,), "q8_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2),
                 "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "q3_k": (108,),
                 "q2_k": (80, 82)}
"""Byte offsets of the half-float scales (``d``, and ``m`` / ``dmin``) in a block of each
type (lower-case ggml type names)."""


def random_block_bytes(kind: str, rows: int, cols: int, *, seed: int = 0,
                       scale: float = 0.01) -> torch.Tensor:
    """uint8 ``(rows, cols / values per block * block bytes)``: random blocks of the ggml type
    ``kind`` (``"q4_k"``, ``"Q6_K"``...: any of :data:`SCALE_OFFSETS`), their half-float scales
    drawn in ``+-[0, scale]``.

    Raises:
        ValueError: ``kind`` is not one of :data:`SCALE_OFFSETS`, or ``cols`` is not a whole
            number of blocks.
    """
    import gguf
    import torch

    kind = kind.lower()
    if kind not in SCALE_OFFSETS:
        raise ValueError(f"random blocks: unknown block type {kind!r} "
                         f"(one of {sorted(SCALE_OFFSETS)})")
    values, per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]
    if cols % values:
        raise ValueError(f"random blocks: {kind} rows hold whole blocks of {values}, "
                         f"not {cols} values")
    generator = torch.Generator().manual_seed(seed)
    nb = cols // values
    raw = torch.randint(0, 256, (rows, nb, per_block), dtype=torch.uint8,
                        generator=generator)  # (N, B, bytes)
    for at in SCALE_OFFSETS[kind]:
        halves = (torch.rand(rows, nb, generator=generator) * 2 - 1) * scale  # (N, B)
        raw[..., at:at + 2] = halves.to(torch.float16)[..., None].view(torch.uint8)
    return raw.reshape(rows, -1)


def random_blocks(fmt: str, out_features: int, in_features: int, *, seed: int = 0,
                  scale: float = 0.01) -> formats.QuantizedWeight:
    """A ``(out_features, in_features)`` weight of random blocks of the package format ``fmt``
    (``quant.formats.FORMATS``), as :func:`random_block_bytes` draws them."""
    formats.check_format(fmt)
    blocks = random_block_bytes(fmt, out_features, in_features, seed=seed, scale=scale)
    return formats.QuantizedWeight(fmt, out_features, in_features, blocks)
