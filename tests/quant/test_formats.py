"""The GGUF block formats: layout, round trip, and bit-for-bit agreement with the gguf package."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from langchain_ascend.errors import LangChainAscendError, QuantizationError
from langchain_ascend.quant import (
    QuantizedWeight,
    bytes_per_block,
    concatenate,
    dequantize,
    nbytes,
    quantize,
)
from langchain_ascend.quant.file_blocks import k_scales_mins
from langchain_ascend.quant.formats import (
    FILE_FORMATS,
    FORMATS,
    GGML_TYPES,
    K_X8_FORMATS,
    X8_FORMATS,
    block_size,
    rows,
    to_layout,
    unpack,
)
from langchain_ascend.testing.random_blocks import random_blocks

gguf = pytest.importorskip("gguf")

GGUF_TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
              "q8_0": gguf.GGMLQuantizationType.Q8_0}


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen)


def test_bytes_per_block_and_nbytes():
    assert [bytes_per_block(f) for f in FORMATS] == [18, 20, 34, 22, 24, 144, 176, 210]
    assert [block_size(f) for f in FORMATS] == [32] * 5 + [256] * 3
    for fmt in FORMATS:  # GGML's own geometry of each type
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(GGML_TYPES[fmt])] == (
            block_size(fmt), bytes_per_block(fmt))
    qw = quantize(_weight(3, 64), "q4_1")
    assert qw.blocks.shape == (3, 40) and qw.blocks.dtype == torch.uint8
    assert nbytes(qw) == 120 and qw.shape == (3, 64) and qw.blocks_per_row == 2


def test_q4_0_layout_of_a_hand_computed_block():
    values = torch.arange(32, dtype=torch.float32) - 16  # -16..15: largest magnitude is -16
    qw = quantize(values[None], "q4_0")
    raw = qw.blocks[0]
    d = -16 / -8  # 2.0
    assert raw[:2].view(torch.float16).item() == d
    q = [min(15, int(v / d + 8.5)) for v in values.tolist()]  # trunc of positives
    assert q[0] == 0 and q[16] == 8 and q[31] == 15
    assert raw[2:].tolist() == [q[j] | (q[j + 16] << 4) for j in range(16)]
    torch.testing.assert_close(dequantize(qw)[0], torch.tensor([(x - 8) * d for x in q]))


def test_q4_1_layout_of_a_hand_computed_block():
    values = torch.linspace(-1.0, 2.0, 32)
    raw = quantize(values[None], "q4_1").blocks[0]
    d, m = np.float16(3.0 / 15), np.float16(-1.0)
    assert raw[:2].view(torch.float16).item() == float(d)
    assert raw[2:4].view(torch.float16).item() == float(m)
    inv = np.float32(1) / np.float32(3.0 / 15)
    q = [min(15, int((np.float32(v) - np.float32(-1.0)) * inv + np.float32(0.5)))
         for v in values.tolist()]
    assert raw[4:].tolist() == [q[j] | (q[j + 16] << 4) for j in range(16)]


def test_q8_0_layout_of_a_hand_computed_block():
    values = torch.zeros(32)
    values[0], values[5], values[31] = 127.0, -63.5, 0.5  # d = 1; roundf: -63.5 -> -64
    raw = quantize(values[None], "q8_0").blocks[0]
    assert raw[:2].view(torch.float16).item() == 1.0
    q = raw[2:].view(torch.int8).tolist()
    assert q[0] == 127 and q[5] == -64 and q[31] == 1 and sum(map(abs, q)) == 127 + 64 + 1


def test_all_zero_blocks_quantize_to_zero():
    for fmt in X8_FORMATS:
        qw = quantize(torch.zeros(2, 64), fmt)
        assert torch.equal(dequantize(qw), torch.zeros(2, 64))


@pytest.mark.parametrize("fmt", X8_FORMATS)
def test_quantize_equals_the_gguf_reference_bit_for_bit(fmt):
    weight = _weight(48, 256, seed=3) * 0.05
    weight[0, :32] = 0.0  # an all-zero block
    weight[1, 5] = 3.0  # an outlier
    weight[2, 40:72] = -1.25  # a constant block
    ours = quantize(weight, fmt).blocks.numpy()
    theirs = gguf.quants.quantize(weight.numpy(), GGUF_TYPES[fmt])
    assert np.array_equal(ours, theirs)
    back = dequantize(quantize(weight, fmt)).numpy()
    assert np.array_equal(back.view(np.uint32),
                          gguf.quants.dequantize(theirs, GGUF_TYPES[fmt]).view(np.uint32))


@pytest.mark.parametrize(("fmt", "levels", "steps"), [("q4_0", 8, 1.0), ("q4_1", 15, 0.5),
                                                    ("q8_0", 127, 0.5)])
def test_round_trip_error_is_within_the_rounding_step(fmt, levels, steps):
    weight = _weight(64, 512, seed=1)
    back = dequantize(quantize(weight, fmt))  # (64, 512)
    blocks = weight.reshape(64, 16, 32)  # (N, B, 32)
    if fmt == "q4_1":
        step = (blocks.amax(-1) - blocks.amin(-1)) / levels  # (64, 16)
    else:
        step = blocks.abs().amax(-1) / levels  # (64, 16)
    error = (back - weight).reshape(64, 16, 32).abs().amax(-1)  # (64, 16)
    # Half a step (q4_0: a whole step on the side opposite its largest value, which maps to
    # -8 while +8 is out of range), plus the half-float rounding of the scale and min.
    bound = step * steps + 2**-10 * blocks.abs().amax(-1)  # (64, 16)
    assert bool((error <= bound).all())
    relative = (back - weight).norm() / weight.norm()
    assert relative < {"q4_0": 0.12, "q4_1": 0.1, "q8_0": 0.006}[fmt]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_float_dtypes_quantize_as_float32(dtype):
    weight = _weight(4, 64).to(dtype)
    assert torch.equal(quantize(weight, "q8_0").blocks,
                       quantize(weight.float(), "q8_0").blocks)


def test_concatenate_stacks_rows_exactly():
    a, b = quantize(_weight(8, 64, 1), "q4_1"), quantize(_weight(4, 64, 2), "q4_1")
    both = concatenate([a, b])
    assert both.shape == (12, 64)
    assert torch.equal(dequantize(both), torch.cat([dequantize(a), dequantize(b)]))
    with pytest.raises(QuantizationError):
        concatenate([a, quantize(_weight(4, 64), "q8_0")])
    with pytest.raises(QuantizationError):
        concatenate([])


def test_typed_errors():
    with pytest.raises(QuantizationError, match="multiple of 32"):
        quantize(_weight(4, 48), "q4_0")
    with pytest.raises(QuantizationError, match="unknown quantized format"):
        quantize(_weight(4, 64), "q3_k")
    with pytest.raises(QuantizationError, match="floating-point"):
        quantize(torch.ones(4, 64, dtype=torch.int32), "q8_0")
    with pytest.raises(QuantizationError, match="2-D"):
        quantize(torch.ones(64), "q8_0")
    with pytest.raises(QuantizationError, match="uint8"):
        QuantizedWeight("q8_0", 2, 32, torch.zeros(2, 34, dtype=torch.int8))
    with pytest.raises(QuantizationError, match="shape"):
        QuantizedWeight("q8_0", 2, 32, torch.zeros(2, 36, dtype=torch.uint8))
    with pytest.raises(QuantizationError, match="multiple of 32"):
        QuantizedWeight("q4_1", 2, 40, torch.zeros(2, 20, dtype=torch.uint8))
    with pytest.raises(QuantizationError):
        bytes_per_block("f16")
    error = pytest.raises(ValueError, quantize, _weight(4, 48), "q4_0").value
    assert isinstance(error, LangChainAscendError)


def _smollm2_reader():
    from langchain_ascend.testing.real_model import smollm2_gguf_path

    try:
        path = smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return gguf.GGUFReader(path)


def test_real_gguf_tensors_dequantize_like_the_gguf_package():
    reader = _smollm2_reader()
    by_type: dict[str, object] = {}
    for tensor in reader.tensors:  # the first tensor of each block format, and one more Q4_1
        fmt = tensor.tensor_type.name.lower()
        if fmt in FORMATS and (fmt not in by_type or tensor.name == "blk.3.ffn_down.weight"):
            by_type[fmt if fmt not in by_type else "q4_1 down"] = tensor
    assert {"q4_1", "q8_0"} <= set(by_type)
    for tensor in by_type.values():
        fmt = tensor.tensor_type.name.lower()
        in_features, out_features = (int(n) for n in tensor.shape)
        raw = np.asarray(tensor.data)  # (out, bytes per row), the blocks as stored
        qw = QuantizedWeight(fmt, out_features, in_features, torch.from_numpy(raw.copy()))
        ours = dequantize(qw).numpy()  # (out, in)
        theirs = gguf.quants.dequantize(raw, tensor.tensor_type)
        assert theirs.shape == ours.shape
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), tensor.name


@pytest.mark.parametrize("fmt", X8_FORMATS)
def test_x8_layout_is_the_same_bytes_interleaved_by_8_rows(fmt):
    qw = quantize(_weight(16, 96, seed=4), fmt)
    x8 = to_layout(qw, "x8")
    assert x8.layout == "x8" and x8.blocks.shape == (2, 8 * qw.blocks.shape[1])
    with pytest.raises(QuantizationError, match="shape"):  # x8 bytes never pass for the file's
        QuantizedWeight(fmt, 16, 96, x8.blocks)
    assert torch.equal(to_layout(x8, "gguf").blocks, qw.blocks)
    assert torch.equal(dequantize(x8), dequantize(qw))
    assert torch.equal(torch.sort(x8.blocks.flatten()).values,
                       torch.sort(qw.blocks.flatten()).values)
    per_block = bytes_per_block(fmt)
    gguf_raw = qw.blocks.reshape(16, 3, per_block)  # (N, B, bytes)
    group, block = 1, 2  # the superblock of rows 8..15, block 2
    sb = x8.blocks.reshape(2, 3, 8 * per_block)[group, block]
    rows8 = gguf_raw[8:16, block]  # (8, bytes): the same blocks in the file's layout
    assert torch.equal(sb[:16].reshape(8, 2), rows8[:, :2])  # the 8 scales
    header = 2
    if fmt == "q4_1":
        assert torch.equal(sb[16:32].reshape(8, 2), rows8[:, 2:4])  # the 8 mins
        header = 4
    values = sb[8 * header:]
    chunks = 8 if fmt == "q8_0" else 4
    for chunk in range(chunks):  # 4 value bytes of each of the 8 rows
        want = rows8[:, header + 4 * chunk:header + 4 * chunk + 4]  # (8, 4)
        assert torch.equal(values[32 * chunk:32 * chunk + 32].reshape(8, 4), want)


def test_x8_rows_and_concatenation_take_whole_groups():
    a = to_layout(quantize(_weight(16, 64, 1), "q8_0"), "x8")
    b = to_layout(quantize(_weight(8, 64, 2), "q8_0"), "x8")
    both = concatenate([a, b])
    assert both.layout == "x8"
    assert torch.equal(dequantize(both), torch.cat([dequantize(a), dequantize(b)]))
    assert torch.equal(dequantize(rows(both, 16, 24)), dequantize(b))
    with pytest.raises(QuantizationError, match="rows"):
        rows(both, 4, 12)
    with pytest.raises(QuantizationError, match="layout"):
        concatenate([a, quantize(_weight(8, 64, 2), "q8_0")])
    with pytest.raises(QuantizationError, match="x8"):
        to_layout(quantize(_weight(12, 64), "q4_0"), "x8")
    with pytest.raises(QuantizationError, match="layout"):
        to_layout(a, "x16")
    g = quantize(_weight(12, 64), "q4_0")
    assert torch.equal(dequantize(rows(g, 3, 7)), dequantize(g)[3:7])


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_concatenating_into_x8_is_the_x8_of_the_concatenation(fmt):
    from langchain_ascend.quant import formats

    torch.manual_seed(3)
    weights = [formats.quantize(torch.randn(rows, 64), fmt) for rows in (16, 8, 24)]
    fused = formats.concatenate(weights, "x8")  # each re-laid straight into its place
    assert fused.layout == "x8" and fused.out_features == 48
    want = formats.to_layout(formats.concatenate(weights), "x8")
    assert torch.equal(fused.blocks, want.blocks)
    back = formats.to_layout(fused, "gguf")
    assert torch.equal(back.blocks, torch.cat([w.blocks for w in weights]))
    out = torch.empty_like(want.blocks)
    written = formats.to_layout(formats.concatenate(weights), "x8", out=out)
    assert written.blocks.data_ptr() == out.data_ptr()  # written in place
    assert torch.equal(out, want.blocks)
    with pytest.raises(QuantizationError, match="out must be"):
        formats.to_layout(weights[0], "x8", out=torch.empty(3, 3, dtype=torch.uint8))
    with pytest.raises(QuantizationError, match="out_features % 8"):
        formats.concatenate([formats.quantize(torch.randn(12, 64), fmt)], "x8")


@pytest.mark.parametrize("fmt", FILE_FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_file_formats_dequantize_like_the_gguf_package_bit_for_bit(fmt, seed):
    # Any bytes with finite half-float scales are a valid block: random blocks cover every
    # nibble, fifth / sixth bit and packed 6-bit scale pattern, large scales included.
    cols = 3 * block_size(fmt)
    for scale in (1e-3, 1.0, 6e4):
        qw = random_blocks(fmt, 11, cols, seed=seed, scale=scale)
        assert qw.blocks.shape == (11, 3 * bytes_per_block(fmt)) and nbytes(qw) == qw.blocks.numel()
        ours = dequantize(qw).numpy()  # (11, cols)
        theirs = gguf.quants.dequantize(qw.blocks.numpy(),
                                        gguf.GGMLQuantizationType(GGML_TYPES[fmt]))
        assert theirs.shape == ours.shape
        assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


def test_k_scales_and_mins_unpack_like_gguf():
    raw = torch.randint(0, 256, (50, 12), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(3))
    sc, mn = k_scales_mins(raw)
    want_sc, want_mn = gguf.quants.Q4_K.get_scale_min(raw.numpy())
    assert np.array_equal(sc.numpy(), want_sc) and np.array_equal(mn.numpy(), want_mn)
    assert int(sc.max()) <= 63 and int(mn.max()) <= 63


def test_a_q4_k_block_by_hand():
    # One superblock: d = 0.5, dmin = 0.25; sub-block j: scale j + 1, min 2 j; q = e % 16
    # (low nibbles: sub-block 2c, high: 2c + 1).
    block = torch.zeros(144, dtype=torch.uint8)
    block[0:2] = torch.tensor([0.5], dtype=torch.float16).view(torch.uint8)
    block[2:4] = torch.tensor([0.25], dtype=torch.float16).view(torch.uint8)
    sc, mn = list(range(1, 9)), [2 * j for j in range(8)]
    for j in range(4):
        block[4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        block[8 + j] = mn[j] | ((mn[j + 4] >> 4) << 6)
        block[12 + j] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    q = torch.arange(32) % 16
    for c in range(4):
        block[16 + 32 * c:48 + 32 * c] = (q | (q << 4)).to(torch.uint8)
    values = dequantize(QuantizedWeight("q4_k", 1, 256, block[None])).reshape(8, 32)
    for j in range(8):
        assert torch.equal(values[j], 0.5 * sc[j] * q.float() - 0.25 * mn[j])


def test_file_formats_are_read_not_written():
    weight = _weight(8, 256)
    for fmt in FILE_FORMATS:
        with pytest.raises(QuantizationError, match="read from GGUF files"):
            quantize(weight, fmt)
        qw = random_blocks(fmt, 8, 256)
        if fmt in K_X8_FORMATS:  # the K-quants take the x8 layout too, exactly
            assert torch.equal(dequantize(to_layout(qw, "x8")), dequantize(qw))
            fused = concatenate([qw, qw], layout="x8")
            assert torch.equal(dequantize(fused), torch.cat([dequantize(qw)] * 2))
        else:
            with pytest.raises(QuantizationError, match="x8"):
                to_layout(qw, "x8")
        with pytest.raises(QuantizationError, match="dequantize"):
            unpack(qw)
        assert torch.equal(dequantize(rows(qw, 2, 5)), dequantize(qw)[2:5])
        both = concatenate([qw, rows(qw, 0, 3)])
        assert torch.equal(dequantize(both), torch.cat([dequantize(qw), dequantize(qw)[:3]]))
    with pytest.raises(QuantizationError, match="multiple of 256"):
        QuantizedWeight("q4_k", 2, 128, torch.zeros(2, 72, dtype=torch.uint8))
    with pytest.raises(QuantizationError, match="concatenate"):
        concatenate([random_blocks("q4_k", 2, 256), random_blocks("q6_k", 2, 256)])
