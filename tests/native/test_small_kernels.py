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
    tiles = matvec.pack_tiles(torch.randn(8, 8))
    assert matvec.matvec_tiles_rows(tiles, torch.randn(3, 8), None) is None
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
@pytest.mark.parametrize(("out_features", "in_features"), [(136, 48), (40, 7), (1000, 576),
                                                           (24, 1536)])
@pytest.mark.parametrize("num_rows", [1, 2, 3, 8, 9, 16, 17, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matvec_over_tiles_for_any_rows_matches_linear(out_features, in_features, num_rows,
                                                       with_bias):
    gen = torch.Generator().manual_seed(out_features + in_features + num_rows)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    rows = torch.randn(num_rows, in_features, generator=gen)
    out = matvec.matvec_tiles_rows(matvec.pack_tiles(weight), rows, bias)  # (M, out)
    assert out.shape == (num_rows, out_features) and out.dtype == torch.float32
    exact = F.linear(rows.double(), weight.double(), None if bias is None else bias.double())
    magnitude = rows.double().abs() @ weight.double().abs().T  # float32 sum error bound
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    assert ((out.double() - exact).abs() <= (in_features + 1) * 2.0 ** -24 * magnitude).all()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_over_tiles_do_not_depend_on_the_other_rows(threads):
    gen = torch.Generator().manual_seed(7)
    weight, bias = torch.randn(200, 96, generator=gen), torch.randn(200, generator=gen)
    tiles = matvec.pack_tiles(weight)
    rows = torch.randn(17, 96, generator=gen)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batch = matvec.matvec_tiles_rows(tiles, rows, bias)  # (17, 200)
        alone = [matvec.matvec_tiles_rows(tiles, rows[i:i + 1], bias)[0] for i in range(17)]
        one_row = matvec.matvec_tiles(tiles, rows[5], bias)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(batch, torch.stack(alone))  # one sequential sum per output, bit for bit
    assert torch.equal(batch[5], one_row)


@needs_kernel
def test_matvec_over_tiles_for_rows_declines_what_it_does_not_take():
    tiles = matvec.pack_tiles(torch.randn(16, 8))
    assert matvec.matvec_tiles_rows(tiles, torch.randn(0, 8), None) is None
    assert matvec.matvec_tiles_rows(tiles, torch.randn(3, 8).double(), None) is None
    assert matvec.matvec_tiles_rows(tiles, torch.randn(3, 12), None) is None
    assert matvec.matvec_tiles_rows(tiles.double(), torch.randn(3, 8), None) is None
    assert matvec.matvec_tiles_rows(tiles, torch.randn(3, 8), torch.randn(12)) is None
    strided = torch.randn(3, 16)[:, ::2]  # copied, not misread
    torch.testing.assert_close(matvec.matvec_tiles_rows(tiles, strided, None),
                               strided @ tiles.transpose(1, 2).reshape(16, 8).T)


def test_rope_kv_into_a_float16_cache_stores_the_rounded_values() -> None:
    """float32 inputs, float16 cache: the same rotated outputs as into a float32 cache, and
    the cache holds those values rounded as torch rounds them."""
    from langchain_ascend.native import rope_kv

    if not rope_kv.available(torch.float32, torch.float16):
        pytest.skip("rope_kv kernel not built here")
    gen = torch.Generator().manual_seed(5)
    tokens, heads, kv_heads, dim = 4, 6, 2, 32
    q = torch.randn(tokens, heads, dim, generator=gen)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=gen) for _ in range(2))
    cos, sin = (torch.randn(tokens, dim, generator=gen) for _ in range(2))
    slots = torch.tensor([3, 17, 40, 41])
    full = torch.zeros(2, kv_heads, 4, 16, dim)
    half = torch.zeros(2, kv_heads, 4, 16, dim, dtype=torch.float16)
    a = rope_kv.rope_and_write(q, k, v, cos, sin, slots, full)
    b = rope_kv.rope_and_write(q, k, v, cos, sin, slots, half)
    assert a is not None and b is not None
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(half, full.half())
