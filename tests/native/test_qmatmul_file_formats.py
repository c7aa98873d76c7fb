"""The native product on the formats read from files (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K blocks as
GGUF stores them): every variant this CPU runs gives the scalar path's bits, a row's result
does not depend on the batch, and the values are the integer reference's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from langchain_ascend.errors import QuantizationError
from langchain_ascend.native import qmatmul
from langchain_ascend.quant.formats import FILE_FORMATS, block_size, dequantize
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


def test_pack_keeps_the_file_layout():
    _, qw = _case(1, 16, 1, "q6_k")
    assert qmatmul.pack(qw) is qw
    with pytest.raises(QuantizationError, match=r"shape \(M, 256\)"):
        qmatmul.qmatmul(torch.zeros(2, 128), qw)
