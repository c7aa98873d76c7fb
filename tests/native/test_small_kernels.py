"""The native mat-vec and RMSNorm kernels against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from langchain_ascend.native import build, matvec, rms_norm
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(1, 8), (7, 16), (8, 512), (1030, 512),
                                                           (512, 1536), (3, 4096)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_matvec_matches_linear(out_features, in_features, with_bias, threads):
    gen = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    row = torch.randn(in_features, generator=gen)
    assert matvec.applies_to(weight, bias)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = matvec.matvec(weight, row, bias)
    finally:
        torch.set_num_threads(previous)
    want = F.linear(row.double(), weight.double(), None if bias is None else bias.double())
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-5)


@needs_kernel
def test_matvec_takes_only_row_major_float32_weights_with_in_a_multiple_of_8():
    weight = torch.randn(16, 32)
    assert matvec.applies_to(weight, None)
    assert not matvec.applies_to(weight.t().contiguous().t(), None)  # column-major
    assert not matvec.applies_to(weight.double(), None)
    assert not matvec.applies_to(torch.randn(16, 12), None)
    assert matvec.matvec(weight, torch.randn(32, dtype=torch.float64), None) is None
    strided = torch.randn(64)[::2]  # a strided input row is copied, not misread
    torch.testing.assert_close(matvec.matvec(weight, strided, None), weight @ strided)


@needs_kernel
@pytest.mark.parametrize("shape", [(8,), (1, 1, 512), (3, 128), (2, 5, 64), (64, 32)])
def test_rms_norm_matches_torch(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 5
    weight = torch.randn(shape[-1], generator=gen)
    out = rms_norm.rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape
    torch.testing.assert_close(out, F.rms_norm(x, (shape[-1],), weight, 1e-6),
                               atol=2e-6, rtol=2e-6)


@needs_kernel
def test_rms_norm_reads_strided_rows_and_declines_what_it_does_not_take():
    base = torch.randn(4, 96)
    x = base[:, 16:80]  # rows 96 apart, 64 wide
    weight = torch.randn(64)
    torch.testing.assert_close(rms_norm.rms_norm(x, weight, 1e-5),
                               F.rms_norm(x, (64,), weight, 1e-5), atol=2e-6, rtol=2e-6)
    assert rms_norm.rms_norm(torch.randn(rms_norm.MAX_ROWS + 1, 64), weight, 1e-5) is None
    assert rms_norm.rms_norm(torch.randn(2, 12), torch.randn(12), 1e-5) is None
    assert rms_norm.rms_norm(x.double(), weight.double(), 1e-5) is None
    assert rms_norm.rms_norm(torch.randn(4, 128)[:, ::2], weight, 1e-5) is None  # strided columns


def test_without_the_library_callers_get_none(monkeypatch):
    monkeypatch.setattr(build, "function", lambda *args: None)
    assert not matvec.available() and not rms_norm.available()
    assert matvec.matvec(torch.randn(8, 8), torch.randn(8), None) is None
    assert rms_norm.rms_norm(torch.randn(1, 8), torch.randn(8), 1e-6) is None


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(8, 8), (40, 24), (4096, 128),
                                                           (3072, 512)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matvec_over_tiles_matches_linear(out_features, in_features, with_bias):
    gen = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    row = torch.randn(in_features, generator=gen)
    tiles = matvec.pack_tiles(weight)
    assert tiles.shape == (out_features // 8, in_features, 8)
    assert torch.equal(tiles[-1, :, 3], weight[out_features - 8 + 3])  # tile t, lane i: row 8t+i
    want = F.linear(row.double(), weight.double(), None if bias is None else bias.double())
    torch.testing.assert_close(matvec.matvec_tiles(tiles, row, bias).double(), want,
                               atol=1e-4, rtol=1e-5)


def test_tiles_need_a_multiple_of_8_outputs():
    with pytest.raises(ValueError, match="out_features % 8"):
        matvec.pack_tiles(torch.randn(12, 8))


@needs_kernel
@pytest.mark.parametrize("num_rows", range(2, matvec.MAX_TILE_ROWS + 1))
@pytest.mark.parametrize("with_bias", [False, True])
def test_matvec_over_tiles_for_a_few_rows_matches_linear(num_rows, with_bias):
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(136, 48, generator=gen)
    bias = torch.randn(136, generator=gen) if with_bias else None
    rows = torch.randn(num_rows, 48, generator=gen)
    out = matvec.matvec_tiles_rows(matvec.pack_tiles(weight), rows, bias)
    want = F.linear(rows.double(), weight.double(), None if bias is None else bias.double())
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-5)


def test_matvec_over_tiles_declines_other_row_counts():
    tiles = matvec.pack_tiles(torch.randn(16, 8))
    assert matvec.matvec_tiles_rows(tiles, torch.randn(1, 8), None) is None
    assert matvec.matvec_tiles_rows(tiles, torch.randn(matvec.MAX_TILE_ROWS + 1, 8), None) is None
