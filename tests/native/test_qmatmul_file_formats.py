"""The native product on the formats read from files (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K blocks as
GGUF stores them, and the K-quants re-laid in the "x8" layout): every variant this CPU runs
gives the scalar path's bits, a row's result does not depend on the batch, and the values are
the integer reference's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from langchain_ascend.errors import QuantizationError
from langchain_ascend.native import qmatmul
from langchain_ascend.quant.formats import (
    FILE_FORMATS,
    K_X8_FORMATS,
    block_size,
    dequantize,
    to_layout,
)
from langchain_ascend.testing import needs_native_kernels
from langchain_ascend.testing.random_blocks import random_blocks

needs_kernel = needs_native_kernels()


def _case(rows: int, out_features: int, blocks: int, fmt: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    in_features = blocks * block_size(fmt)
    x = torch.randn(rows, in_features, generator=gen)
    x[0, :32] = 0.0  # an all-zero activation block
    if rows > 3:
        x[3, 64:96] *= 1e4  # a block much larger than the rest of its row
    return x, random_blocks(fmt, out_features, in_features, seed=seed + 1)


@pytest.fixture
def variant(monkeypatch):
    def force(name: str) -> None:
        monkeypatch.setenv(qmatmul.VARIANT_ENV_VAR, name)
        qmatmul.kernel_variant.cache_clear()

    yield force
    monkeypatch.delenv(qmatmul.VARIANT_ENV_VAR, raising=False)
    qmatmul.kernel_variant.cache_clear()


@needs_kernel
@pytest.mark.parametrize("fmt", FILE_FORMATS)
@pytest.mark.parametrize(("rows", "out_features", "blocks"),
                         [(1, 16, 1), (1, 37, 3), (5, 24, 2), (17, 9, 4), (64, 40, 1),
                          (70, 33, 2)])
def test_matches_the_integer_reference(fmt, rows, out_features, blocks):
    x, qw = _case(rows, out_features, blocks, fmt)
    bias = torch.randn(out_features)
    out = qmatmul.qmatmul(x, qw, bias)
    want = qmatmul.reference_qmatmul(x, qw, bias)
    scale = want.abs().amax(dim=1, keepdim=True).clamp_min(1.0)  # (M, 1)
    torch.testing.assert_close(out / scale, want / scale, atol=2e-6, rtol=0)


@needs_kernel
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_every_variant_gives_the_scalar_bits_for_1_to_64_rows(fmt, variant):
    # 16 + 16 + 2 outputs: whole work items of 16 rows and a tail; with AVX512 the K-quants
    # take two weight rows per step above 4 rows, one below (and for an odd last row).
    x, qw = _case(70, 35, 3, fmt, seed=4)
    bias = torch.randn(35)
    variant("scalar")
    want = qmatmul.qmatmul(x, qw, bias)
    names = [name for name in qmatmul.VARIANTS[1:] if qmatmul.supported(name)]
    assert "avx2" in names
    for name in names:
        variant(name)
        for rows in (1, 2, 3, 4, 5, 7, 16, 33, 64, 70):
            assert torch.equal(qmatmul.qmatmul(x[:rows], qw, bias), want[:rows]), (name, rows)
        assert torch.equal(qmatmul.qmatmul(x[9:10], qw, bias), want[9:10]), name


@needs_kernel
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_a_row_does_not_depend_on_the_batch_nor_the_threads(fmt):
    x, qw = _case(130, 48, 2, fmt, seed=3)  # row blocks of 64, 64, 2
    full = qmatmul.qmatmul(x, qw)
    for i in (0, 5, 63, 64, 129):
        assert torch.equal(qmatmul.qmatmul(x[i:i + 1], qw), full[i:i + 1])
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qmatmul.qmatmul(x, qw)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, full)


@needs_kernel
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_close_to_the_dequantized_float_product(fmt):
    x, qw = _case(8, 64, 3, fmt, seed=2)
    x[3, 64:96] /= 1e4
    out = qmatmul.qmatmul(x, qw)
    want = F.linear(x.double(), dequantize(qw).double()).float()  # (8, 64)
    # Only the activations' int8 rounding differs: about 1 / 254 of each block's largest value.
    assert (out - want).norm() / want.norm() < 0.01


@needs_kernel
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_bfloat16_input_and_strided_rows(fmt):
    x, qw = _case(5, 24, 2, fmt, seed=6)
    x16 = x.bfloat16()
    assert torch.equal(qmatmul.qmatmul(x16, qw), qmatmul.qmatmul(x16.float(), qw))
    wide = torch.zeros(5, 2 * x.shape[1])
    wide[:, :x.shape[1]] = x
    assert torch.equal(qmatmul.qmatmul(wide[:, :x.shape[1]], qw), qmatmul.qmatmul(x, qw))


def test_reference_runs_without_the_kernel(monkeypatch):
    x, qw = _case(3, 16, 1, "q4_k", seed=9)
    monkeypatch.setattr(qmatmul, "_kernel", lambda: None)
    out = qmatmul.qmatmul(x, qw, torch.ones(16))
    torch.testing.assert_close(out, qmatmul.reference_qmatmul(x, qw) + 1)


def test_pack_relays_the_k_quants_only():
    _, qw = _case(1, 16, 1, "q6_k")
    assert qmatmul.pack(qw).layout == "x8"
    for fmt, rows in (("q5_0", 16), ("q5_1", 16), ("q4_k", 12)):
        _, other = _case(1, rows, 1, fmt)
        assert qmatmul.pack(other) is other
    with pytest.raises(QuantizationError, match=r"shape \(M, 256\)"):
        qmatmul.qmatmul(torch.zeros(2, 128), qw)


# ---- the K-quants in the x8 layout ----------------------------------------------------------


def _x8_case(rows: int, out_features: int, blocks: int, fmt: str, seed: int = 0):
    x, qw = _case(rows, out_features, blocks, fmt, seed)
    return x, qw, to_layout(qw, "x8")


@pytest.mark.parametrize("fmt", K_X8_FORMATS)
def test_x8_layout_is_the_same_bytes_interleaved_by_8_rows(fmt):
    _, qw, x8 = _x8_case(1, 16, 2, fmt)
    assert torch.equal(to_layout(x8, "gguf").blocks, qw.blocks)
    assert torch.equal(dequantize(x8), dequantize(qw))
    raw = qw.blocks.reshape(16, 2, -1)  # (N, superblocks, bytes)
    group = x8.blocks.reshape(2, 2, -1)  # (N / 8, superblocks, 8 * bytes)
    r, n, s = 5, 13, 1  # row 13 is row 5 of group 1
    if fmt == "q6_k":
        assert torch.equal(group[1, s, 2 * r:2 + 2 * r], raw[n, s, 208:210])  # d
        assert group[1, s, 16 + 8 * 3 + r] == raw[n, s, 192 + 3]  # scale 3
        assert torch.equal(group[1, s, 144 + 32 * 7 + 4 * r:144 + 32 * 7 + 4 * r + 4],
                           raw[n, s, 28:32])  # ql word 7
        assert torch.equal(group[1, s, 912 + 32 * 2 + 4 * r:912 + 32 * 2 + 4 * r + 4],
                           raw[n, s, 72:76])  # ql word 18
        assert torch.equal(group[1, s, 1168 + 32 * 1 + 4 * r:1168 + 32 * 1 + 4 * r + 4],
                           raw[n, s, 128 + 36:128 + 40])  # qh word 9
    else:
        assert torch.equal(group[1, s, 16 + 2 * r:18 + 2 * r], raw[n, s, 2:4])  # dmin
        assert torch.equal(group[1, s, 32 + 32 * 2 + 4 * r:32 + 32 * 2 + 4 * r + 4],
                           raw[n, s, 12:16])  # the scales' third word
        qs = 128 if fmt == "q4_k" else 384
        assert torch.equal(group[1, s, qs + 32 * 9 + 4 * r:qs + 32 * 9 + 4 * r + 4],
                           raw[n, s, qs // 8 + 36:qs // 8 + 40])  # nibbles word 9


@needs_kernel
@pytest.mark.parametrize("fmt", K_X8_FORMATS)
@pytest.mark.parametrize(("rows", "out_features", "blocks"),
                         [(1, 8, 1), (1, 40, 3), (5, 24, 2), (17, 16, 4), (64, 40, 1),
                          (70, 8, 2)])
def test_x8_matches_the_integer_reference(fmt, rows, out_features, blocks):
    x, qw, x8 = _x8_case(rows, out_features, blocks, fmt)
    bias = torch.randn(out_features)
    out = qmatmul.qmatmul(x, x8, bias)
    want = qmatmul.reference_qmatmul(x, qw, bias)
    scale = want.abs().amax(dim=1, keepdim=True).clamp_min(1.0)  # (M, 1)
    torch.testing.assert_close(out / scale, want / scale, atol=2e-6, rtol=0)
    # the file's layout sums the same integers in another float order
    torch.testing.assert_close(out / scale, qmatmul.qmatmul(x, qw, bias) / scale, atol=2e-6,
                               rtol=0)


@needs_kernel
@pytest.mark.parametrize("fmt", K_X8_FORMATS)
def test_x8_every_variant_gives_the_scalar_bits_for_1_to_70_rows(fmt, variant):
    # 40 outputs: two 16-row work items (with AVX512 one 512-bit panel each) and an 8-row tail
    x, _, x8 = _x8_case(70, 40, 3, fmt, seed=4)
    bias = torch.randn(40)
    variant("scalar")
    want = qmatmul.qmatmul(x, x8, bias)
    names = [name for name in qmatmul.VARIANTS[1:] if qmatmul.supported(name)]
    assert "avx2" in names
    for name in names:
        variant(name)
        for rows in (1, 2, 3, 4, 5, 7, 16, 33, 64, 70):
            assert torch.equal(qmatmul.qmatmul(x[:rows], x8, bias), want[:rows]), (name, rows)
        assert torch.equal(qmatmul.qmatmul(x[9:10], x8, bias), want[9:10]), name


@needs_kernel
@pytest.mark.parametrize("fmt", K_X8_FORMATS)
def test_x8_a_row_does_not_depend_on_the_batch_nor_the_threads(fmt):
    x, _, x8 = _x8_case(130, 24, 2, fmt, seed=3)  # row blocks of 64, 64, 2
    full = qmatmul.qmatmul(x, x8)
    for i in (0, 5, 63, 64, 129):
        assert torch.equal(qmatmul.qmatmul(x[i:i + 1], x8), full[i:i + 1])
    assert torch.equal(qmatmul.qmatmul(x[60:70], x8), full[60:70])
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qmatmul.qmatmul(x, x8)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, full)


@needs_kernel
@pytest.mark.parametrize("fmt", K_X8_FORMATS)
def test_x8_bfloat16_input_strided_rows_and_out(fmt):
    x, _, x8 = _x8_case(5, 16, 2, fmt, seed=6)
    x16 = x.bfloat16()
    assert torch.equal(qmatmul.qmatmul(x16, x8), qmatmul.qmatmul(x16.float(), x8))
    wide = torch.zeros(5, 2 * x.shape[1])
    wide[:, :x.shape[1]] = x
    assert torch.equal(qmatmul.qmatmul(wide[:, :x.shape[1]], x8), qmatmul.qmatmul(x, x8))
    out = torch.empty(5, 16)
    assert qmatmul.qmatmul(x, x8, out=out) is out
    assert torch.equal(out, qmatmul.qmatmul(x, x8))


def test_x8_layout_refuses_other_formats_and_partial_groups():
    _, qw = _case(1, 12, 1, "q4_k")
    with pytest.raises(QuantizationError, match="out_features % 8"):
        to_layout(qw, "x8")
    _, q5 = _case(1, 16, 1, "q5_0")
    with pytest.raises(QuantizationError, match="x8 layout takes"):
        to_layout(q5, "x8")
