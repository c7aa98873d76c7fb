"""The native x8 re-laying (``native/block_layout.c``) against the layout's definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from langchain_ascend.native import block_layout
from langchain_ascend.quant import formats
from langchain_ascend.quant.x8_fields import block_dtypes, field_table
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


def _x8_by_definition(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """``(N, B * P)`` row blocks -> ``(N / 8, 8 * B * P)`` superblocks, byte by byte: rows
    ``8g..8g+7``, block ``b``: the 8 header half-words (half ``h`` of row ``r`` at ``h * 8 +
    r``), then the value words (word ``c`` of row ``r`` at ``c * 8 + r``)."""
    per_block, header = formats.bytes_per_block(fmt), formats.header_bytes(fmt)
    rows = blocks.shape[0]
    num_blocks = blocks.shape[1] // per_block
    raw = blocks.reshape(rows // 8, 8, num_blocks, per_block)  # (G, 8, B, P)
    head = raw[..., :header].reshape(rows // 8, 8, num_blocks, header // 2, 2)
    values = raw[..., header:].reshape(rows // 8, 8, num_blocks, -1, 4)
    superblocks = np.concatenate([
        head.transpose(0, 2, 3, 1, 4).reshape(rows // 8, num_blocks, -1),  # (G, B, halves*8*2)
        values.transpose(0, 2, 3, 1, 4).reshape(rows // 8, num_blocks, -1)], axis=-1)
    return superblocks.reshape(rows // 8, -1)


def _x8_by_fields(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """The same by the layout's field records (``quant.x8_fields``): element ``i`` of a
    field of row ``r`` at ``superblock[field][i, r]``, the fields in the layout's order."""
    row, superblock = block_dtypes(fmt, 8)
    groups = blocks.shape[0] // 8
    rows_in = blocks.view(row).reshape(groups, 8, -1)  # (G, 8, B)
    out = np.zeros(groups * rows_in.shape[2], dtype=superblock)
    grouped = out.reshape(groups, -1)
    for name in row.names:
        grouped[name] = rows_in[name].transpose(0, 2, 3, 1)  # (G, B, count, 8)
    return out.view(np.uint8).reshape(groups, -1)


def _weight(fmt: str, rows: int, cols: int, seed: int) -> formats.QuantizedWeight:
    """A weight of ``fmt``: quantized from random values where we quantize it, else random
    blocks (the re-laying moves bytes; what they mean does not matter)."""
    gen = torch.Generator().manual_seed(seed)
    if fmt in formats.X8_FORMATS:
        return formats.quantize(torch.randn(rows, cols, generator=gen), fmt)
    per_row = cols // formats.block_size(fmt) * formats.bytes_per_block(fmt)
    blocks = torch.randint(0, 256, (rows, per_row), dtype=torch.uint8, generator=gen)
    return formats.QuantizedWeight(fmt, rows, cols, blocks, "gguf")


@needs_kernel
@pytest.mark.parametrize("fmt", formats.X8_LAYOUT_FORMATS)
@pytest.mark.parametrize(("rows", "cols"), [(8, 256), (24, 512), (64, 2048)])
def test_native_x8_is_the_layout_byte_for_byte(fmt, rows, cols):
    qweight = _weight(fmt, rows, cols, rows + cols)
    out = torch.empty(rows // 8, 8 * qweight.blocks.shape[1], dtype=torch.uint8)
    assert block_layout.x8_from_rows(qweight.blocks, out, block_bytes=formats.bytes_per_block(fmt),
                                     fields=field_table(fmt))
    assert np.array_equal(out.numpy(), _x8_by_fields(qweight.blocks.numpy(), fmt))
    if fmt in formats.X8_FORMATS:
        assert np.array_equal(out.numpy(), _x8_by_definition(qweight.blocks.numpy(), fmt))
    relaid = formats.to_layout(qweight, "x8")  # the path every load takes
    assert torch.equal(relaid.blocks, out)
    assert torch.equal(formats.to_layout(relaid, "gguf").blocks, qweight.blocks)


@needs_kernel
def test_native_x8_reads_strided_rows_of_a_larger_buffer():
    """A view of a file's map: rows further apart than their bytes."""
    qweight = formats.quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(3)),
                               "q4_0")
    row_bytes = qweight.blocks.shape[1]
    wide = torch.zeros(16, row_bytes + 10, dtype=torch.uint8)
    wide[:, :row_bytes] = qweight.blocks
    out = torch.empty(2, 8 * row_bytes, dtype=torch.uint8)
    assert block_layout.x8_from_rows(wide[:, :row_bytes], out, block_bytes=18,
                                     fields=field_table("q4_0"))
    assert np.array_equal(out.numpy(), _x8_by_definition(qweight.blocks.numpy(), "q4_0"))


@needs_kernel
def test_native_x8_declines_what_it_does_not_lay_out():
    fields = field_table("q4_0")
    blocks = torch.zeros(12, 36, dtype=torch.uint8)  # 12 rows: not whole groups of 8
    assert not block_layout.x8_from_rows(blocks, torch.empty(1, 8 * 36, dtype=torch.uint8),
                                         block_bytes=18, fields=fields)
    blocks = torch.zeros(8, 36, dtype=torch.uint8)
    assert not block_layout.x8_from_rows(blocks, torch.empty(2, 4 * 36, dtype=torch.uint8),
                                         block_bytes=18, fields=fields)  # out of another shape
    assert not block_layout.x8_from_rows(blocks.t(), torch.empty(4, 8 * 8, dtype=torch.uint8),
                                         block_bytes=18, fields=fields)  # column-major rows


@needs_kernel
def test_native_x8_refuses_a_field_outside_the_block():
    blocks = torch.zeros(8, 36, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="status 2"):
        block_layout.x8_from_rows(blocks, torch.empty(1, 8 * 36, dtype=torch.uint8),
                                  block_bytes=18, fields=[(0, 2, 1, 0), (2, 4, 5, 16)])
    with pytest.raises(RuntimeError, match="status 2"):  # bytes 2..5 never move
        block_layout.x8_from_rows(blocks, torch.empty(1, 8 * 36, dtype=torch.uint8),
                                  block_bytes=18, fields=[(0, 2, 1, 0), (6, 4, 3, 48)])
