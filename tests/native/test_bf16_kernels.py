"""The native bfloat16 kernels against torch: the tiles product (float32 sums, one rounding) and
RMSNorm in transformers' rounding order (bit for bit)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from langchain_ascend.native import build, matvec, rms_norm
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 steps between two finite bf16 tensors of one sign pattern."""
    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).int()  # sign-magnitude -> a monotonic integer line
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)
    return (ordered(a) - ordered(b)).abs()


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     ) -> torch.Tensor:
    out = x.float() @ weight.float().T  # (M, N), float32 sums of exact products
    if bias is not None:
        out = out + bias.float()
    return out.bfloat16()


def within_float32_sum_error(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None) -> torch.Tensor:
    """Whether each output is the exact result rounded to bf16, give or take one bf16 step and
    the error bound of a float32 sum in any order (which matters where terms cancel)."""
    exact = x.double() @ weight.double().T  # (M, N)
    magnitude = x.double().abs() @ weight.double().abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    bf16_step = exact.abs() * 2.0 ** -7
    sum_error = (x.shape[1] + 1) * 2.0 ** -24 * magnitude
    return (out.double() - exact).abs() <= bf16_step + sum_error


def transformers_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward for bf16 inputs, op for op."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(136, 48), (40, 7), (1000, 576),
                                                           (24, 1536)])
@pytest.mark.parametrize("num_rows", [1, 3, 8, 9, 17, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_tiles_match_float32_math_rounded_once(out_features, in_features, num_rows,
                                                    with_bias):
    gen = torch.Generator().manual_seed(out_features + in_features + num_rows)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    rows = torch.randn(num_rows, in_features, generator=gen).bfloat16()
    out = matvec.matvec_tiles_rows_bf16(matvec.pack_tiles(weight), rows, bias)
    want = reference_linear(rows, weight, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (num_rows, out_features)
    assert within_float32_sum_error(out, rows, weight, bias).all()
    ulps = bf16_ulps(out, want)
    assert (ulps == 0).float().mean() > 0.99
    torch_ulps = bf16_ulps(F.linear(rows, weight, bias), want)
    assert (ulps != 0).sum() <= 4 * (torch_ulps != 0).sum() + 4  # as close as torch's own


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_tiles_give_each_row_the_same_result_in_any_batch(threads):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(200, 96, generator=gen).bfloat16()
    bias = torch.randn(200, generator=gen).bfloat16()
    rows = torch.randn(40, 96, generator=gen).bfloat16()
    tiles = matvec.pack_tiles(weight)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = matvec.matvec_tiles_rows_bf16(tiles, rows, bias)
        for count in (1, 2, 3, 5, 9, 17, 33):
            assert torch.equal(matvec.matvec_tiles_rows_bf16(tiles, rows[:count], bias),
                               full[:count])
        assert torch.equal(matvec.matvec_tiles_rows_bf16(tiles, rows[7:8], bias)[0], full[7])
    finally:
        torch.set_num_threads(previous)


@needs_kernel
def test_bf16_tiles_round_to_nearest_even_and_keep_nan_and_inf():
    # Each output j is x[0] + x[1] with weight rows (1, 1): a float32 sum, rounded once.
    weight = torch.ones(8, 2, dtype=torch.bfloat16)
    big = torch.finfo(torch.bfloat16).max
    cases = [(1.0, 2.0 ** -8), (1.0 + 2.0 ** -7, 2.0 ** -8), (1.0, 3 * 2.0 ** -9),
             (-1.0, -(2.0 ** -8)), (float("inf"), 1.0), (big, big), (float("nan"), 0.0),
             (-0.0, -0.0)]
    rows = torch.tensor(cases, dtype=torch.float32).bfloat16()  # every value is exact in bf16
    out = matvec.matvec_tiles_rows_bf16(matvec.pack_tiles(weight), rows, None)[:, 0]  # (8,)
    want = (rows.float() @ weight.float().T)[:, 0].bfloat16()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))  # NaN bits included
    assert out[:2].tolist() == [1.0, 1.0 + 2.0 ** -6]  # ties to even, both ways
    assert out[5].item() == float("inf")


@needs_kernel
def test_bf16_tiles_add_the_bias_before_rounding():
    weight = torch.ones(8, 1, dtype=torch.bfloat16)
    rows = torch.tensor([[1.0]], dtype=torch.bfloat16)
    bias = torch.full((8,), 2.0 ** -8, dtype=torch.bfloat16) * 1.5  # 1 + 1.5 * 2^-8 -> 1 + 2^-7
    out = matvec.matvec_tiles_rows_bf16(matvec.pack_tiles(weight), rows, bias)
    assert out.tolist() == [[1.0 + 2.0 ** -7] * 8]


@needs_kernel
def test_bf16_tiles_decline_what_they_do_not_take():
    weight = torch.randn(16, 8).bfloat16()
    tiles = matvec.pack_tiles(weight)
    rows = torch.randn(2, 8).bfloat16()
    assert matvec.matvec_tiles_rows_bf16(tiles.float(), rows, None) is None
    assert matvec.matvec_tiles_rows_bf16(tiles, rows.float(), None) is None
    assert matvec.matvec_tiles_rows_bf16(tiles, torch.randn(2, 12).bfloat16(), None) is None
    assert matvec.matvec_tiles_rows_bf16(tiles, rows[:0], None) is None
    assert matvec.matvec_tiles_rows_bf16(tiles, rows, torch.randn(16)) is None  # float32 bias
    assert matvec.matvec_tiles_rows_bf16(tiles, rows, torch.randn(8).bfloat16()) is None
    strided = torch.randn(2, 16).bfloat16()[:, ::2]  # copied, not misread
    torch.testing.assert_close(matvec.matvec_tiles_rows_bf16(tiles, strided, None),
                               reference_linear(strided, weight, None), atol=0, rtol=2 ** -7)


@needs_kernel
@pytest.mark.parametrize("size", [8, 64, 136, 576, 960, 2048, 8192])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_bf16_rms_norm_equals_transformers_bit_for_bit(size, scale):
    gen = torch.Generator().manual_seed(size)
    x = (torch.randn(rms_norm.MAX_ROWS, size, generator=gen) * scale).bfloat16()
    weight = torch.randn(size, generator=gen).bfloat16()
    for eps in (1e-5, 1e-6):
        out = rms_norm.rms_norm_bf16(x, weight, eps)
        assert out.dtype == torch.bfloat16
        assert torch.equal(out.view(torch.int16), transformers_rms_norm(x, weight, eps)
                           .view(torch.int16))


@needs_kernel
def test_bf16_rms_norm_reads_strided_rows_and_declines_what_it_does_not_take():
    base = torch.randn(2, 3, 96).bfloat16()
    x = base[..., 16:80]  # rows 96 apart, 64 wide
    weight = torch.randn(64).bfloat16()
    assert torch.equal(rms_norm.rms_norm_bf16(x, weight, 1e-5),
                       transformers_rms_norm(x, weight, 1e-5))
    assert rms_norm.rms_norm_bf16(x, weight.float(), 1e-5) is None
    assert rms_norm.rms_norm_bf16(x.float(), weight, 1e-5) is None
    assert rms_norm.rms_norm_bf16(torch.randn(2, 12).bfloat16(), torch.randn(12).bfloat16(),
                                  1e-5) is None
    assert rms_norm.rms_norm_bf16(torch.randn(rms_norm.MAX_ROWS + 1, 64).bfloat16(), weight,
                                  1e-5) is None
    assert rms_norm.rms_norm(x, weight, 1e-5) is None  # the float32 kernel takes float32 only


def test_without_the_library_the_bf16_kernels_decline(monkeypatch):
    monkeypatch.setattr(build, "function", lambda *args, **kwargs: None)
    assert not matvec.bf16_available()
    tiles = matvec.pack_tiles(torch.randn(8, 8).bfloat16())
    assert matvec.matvec_tiles_rows_bf16(tiles, torch.randn(1, 8).bfloat16(), None) is None
    assert rms_norm.rms_norm_bf16(torch.randn(1, 8).bfloat16(), torch.randn(8).bfloat16(),
                                  1e-6) is None
