"""The quantized-weight product (native ``qmatmul.c``) against torch references."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from langchain_ascend.errors import QuantizationError
from langchain_ascend.native import build, qmatmul
from langchain_ascend.quant import dequantize, quantize
from langchain_ascend.quant.formats import X8_FORMATS as FORMATS
from langchain_ascend.quant.formats import QuantizedWeight, to_layout
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


LAYOUTS = ["gguf", "x8"]


def _case(rows: int, out_features: int, in_features: int, fmt: str, seed: int = 0,
          layout: str = "gguf"):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    x = torch.randn(rows, in_features, generator=gen)
    x[0, :32] = 0.0  # an all-zero activation block
    return x, to_layout(quantize(weight, fmt), layout)


@pytest.fixture
def variant(monkeypatch):
    """Run qmatmul with one forced instruction-set variant."""

    def force(name: str) -> None:
        monkeypatch.setenv(qmatmul.VARIANT_ENV_VAR, name)
        qmatmul.kernel_variant.cache_clear()

    yield force
    monkeypatch.delenv(qmatmul.VARIANT_ENV_VAR, raising=False)
    qmatmul.kernel_variant.cache_clear()


def test_choose_variant_by_cpu_flags():
    assert qmatmul.choose_variant({"avx2", "fma"}) == "avx2"
    assert qmatmul.choose_variant({"avx2", "avx512_vnni", "avx512vl"}) == "avx512vnni"
    assert qmatmul.choose_variant({"avx2", "avx512_vnni"}) == "avx2"
    assert qmatmul.choose_variant({"avx2", "avx_vnni"}) == "avxvnni"
    assert qmatmul.choose_variant({"avx2", "avx_vnni", "avx512_vnni"}) == "avxvnni"
    assert qmatmul.choose_variant({"avx2", "avx_vnni", "avx512_vnni", "avx512vl",
                                   "amx_int8"}) == "avx512vnni"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scalar", [False, True])
def test_activation_quantization_matches_torch(dtype, scalar):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 96, generator=gen) * 3).to(dtype)
    x[1, 32:64] = 0.0
    x[2, 0] = 127 * 0.5  # ties: x / d lands on halves, rounded to even
    x[2, 1:32] = torch.arange(1, 32) * 0.5
    rows, width = x.shape
    num_blocks = width // 32
    q = torch.empty(rows, width, dtype=torch.int8)
    d = torch.empty(rows, num_blocks)
    s = torch.empty(rows, num_blocks)
    corr = torch.empty(rows, num_blocks, 8, dtype=torch.int32)
    totals = torch.empty(rows, num_blocks, dtype=torch.int32)
    ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn = build.function("qmatmul", "qmatmul_quantize_rows",
                        [c_int, c_int, ptr, c_int, i64, i64, ptr, ptr, ptr, ptr, ptr])
    for fmt, code in qmatmul.FORMAT_CODES.items():
        status = fn(code, 0 if scalar else 1, x.data_ptr(), 0 if dtype == torch.float32 else 1,
                    rows, width, q.data_ptr(), d.data_ptr(), s.data_ptr(), corr.data_ptr(),
                    totals.data_ptr())
        assert status == 0
        want_q, want_d = qmatmul.quantize_activations(x)  # (M, B, 32), (M, B)
        assert torch.equal(q.reshape(rows, num_blocks, 32), want_q)
        assert torch.equal(d, want_d)
        sums = want_q.to(torch.int32).reshape(rows, num_blocks, 8, 4).sum(-1)  # (M, B, 8)
        assert torch.equal(totals, sums.sum(-1))
        if fmt in ("q4_1", "q5_1"):
            assert torch.equal(s, want_d * sums.sum(-1).float())
        if fmt in ("q4_0", "q5_0"):
            assert torch.equal(corr, (8 if fmt == "q4_0" else 16) * sums)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("rows", "out_features", "in_features"),
                         [(1, 8, 32), (1, 192, 576), (3, 40, 64), (16, 200, 1536), (70, 24, 96)])
def test_matches_the_integer_reference(fmt, layout, rows, out_features, in_features):
    x, qw = _case(rows, out_features, in_features, fmt, layout=layout)
    out = qmatmul.qmatmul(x, qw)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    want = qmatmul.reference_qmatmul(x.double().float(), qw)
    scale = want.abs().amax().clamp_min(1.0)
    torch.testing.assert_close(out, want, atol=2e-6 * scale * in_features**0.5 / 4, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_close_to_the_dequantized_float_product(fmt, layout):
    x, qw = _case(8, 256, 576, fmt, seed=2, layout=layout)
    out = qmatmul.qmatmul(x, qw)
    want = F.linear(x.double(), dequantize(qw).double()).float()  # (8, 256)
    # Only the activations' int8 rounding differs: about 1 / 254 of each block's largest value.
    relative = (out - want).norm() / want.norm()
    assert relative < 0.01
    assert (out - want).abs().max() < 0.05 * want.abs().max()


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_row_does_not_depend_on_the_batch(fmt, layout):
    x, qw = _case(130, 96, 576, fmt, seed=3, layout=layout)  # row blocks of 64, 64, 2
    full = qmatmul.qmatmul(x, qw)
    for rows in (1, 2, 3, 5, 16, 64):
        part = qmatmul.qmatmul(x[:rows], qw)
        assert torch.equal(part, full[:rows]), rows
    for i in (0, 7, 15, 64, 129):
        assert torch.equal(qmatmul.qmatmul(x[i:i + 1], qw), full[i:i + 1])
    batch16 = qmatmul.qmatmul(x[:16], qw)
    for i in range(16):
        assert torch.equal(qmatmul.qmatmul(x[i:i + 1], qw)[0], batch16[i])


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prefill_row_does_not_depend_on_the_span_or_threads(fmt, layout):
    # 300 rows: a span of 256 (4 row blocks) and one of 44; work items shared dynamically.
    x, qw = _case(300, 48, 256, fmt, seed=13, layout=layout)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = qmatmul.qmatmul(x, qw)
        torch.set_num_threads(1)
        assert torch.equal(qmatmul.qmatmul(x, qw), full)
    finally:
        torch.set_num_threads(previous)
    for lo, hi in ((250, 300), (255, 257), (64, 128), (0, 1), (299, 300), (1, 299)):
        assert torch.equal(qmatmul.qmatmul(x[lo:hi], qw), full[lo:hi]), (lo, hi)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_threads_do_not_change_results(fmt, layout):
    x, qw = _case(9, 120, 256, fmt, seed=4, layout=layout)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qmatmul.qmatmul(x, qw)
        torch.set_num_threads(2)
        two = qmatmul.qmatmul(x, qw)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_variant_this_cpu_runs_gives_the_same_bits(fmt, layout, variant):
    x, qw = _case(6, 72, 320, fmt, seed=5, layout=layout)
    bias = torch.randn(72)
    results = {}
    for name in qmatmul.VARIANTS:
        if qmatmul.supported(name):
            variant(name)
            assert qmatmul.kernel_variant() == name
            results[name] = qmatmul.qmatmul(x, qw, bias)
    assert {"scalar", "avx2"} <= set(results)
    for name, out in results.items():
        assert torch.equal(out, results["scalar"]), name


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_x8_path_gives_the_scalar_bits(fmt, variant):
    # The x8 kernels pick register tiles (few rows), panels of 8 weight rows applied to every
    # row, or (AVX512) panels of 16 weight rows, by row count and what is left of a group of
    # 16 outputs: 88 = 5 * 16 + 8 outputs, and row counts on both sides of each switch.
    x, qw = _case(70, 88, 192, fmt, seed=11, layout="x8")
    x[3, 64:96] *= 1e4  # a block much larger than the rest of its row
    bias = torch.randn(88)
    variant("scalar")
    want = qmatmul.qmatmul(x, qw, bias)
    names = [name for name in qmatmul.VARIANTS[1:] if qmatmul.supported(name)]
    assert "avx2" in names
    for name in names:
        variant(name)
        for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64, 70):
            assert torch.equal(qmatmul.qmatmul(x[:rows], qw, bias), want[:rows]), (name, rows)
        assert torch.equal(qmatmul.qmatmul(x[5:6], qw, bias), want[5:6]), name


@needs_kernel
def test_q8_0_weights_of_minus_128_are_exact_in_the_x8_layout(variant):
    # GGUF's quantizer writes -127..127, but a file may hold -128: every variant (the sign
    # trick takes |w|, the VNNI kernels w + 128) still gives the integer reference's bits.
    x, qw = _case(9, 24, 96, "q8_0", seed=12)
    blocks = qw.blocks.clone()
    values = blocks.view(24, 3, 34)[:, :, 2:]  # (N, B, 32) int8 values as bytes
    values[::3, :, ::5] = 128  # -128
    qw = QuantizedWeight("q8_0", 24, 96, blocks)
    packed = to_layout(qw, "x8")
    variant("scalar")
    want = qmatmul.qmatmul(x, packed)
    torch.testing.assert_close(want, qmatmul.reference_qmatmul(x, qw), atol=1e-4, rtol=1e-5)
    for name in qmatmul.VARIANTS[1:]:
        if qmatmul.supported(name):
            variant(name)
            for rows in (1, 2, 5, 9):
                assert torch.equal(qmatmul.qmatmul(x[:rows], packed), want[:rows]), (name, rows)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_input_equals_its_float32_values(fmt, layout):
    x, qw = _case(5, 64, 128, fmt, seed=6, layout=layout)
    x16 = x.bfloat16()
    assert torch.equal(qmatmul.qmatmul(x16, qw), qmatmul.qmatmul(x16.float(), qw))


@needs_kernel
def test_bias_out_and_strided_rows():
    x, qw = _case(4, 40, 64, "q4_1", seed=7)
    bias = torch.randn(40)
    plain = qmatmul.qmatmul(x, qw)
    assert torch.equal(qmatmul.qmatmul(x, qw, bias), plain + bias)
    assert torch.equal(qmatmul.qmatmul(x, qw, bias.bfloat16()), plain + bias.bfloat16().float())
    out = torch.empty(4, 40)
    assert qmatmul.qmatmul(x, qw, out=out) is out and torch.equal(out, plain)
    wide = torch.randn(4, 128)
    wide[:, :64] = x  # rows with a stride of 128
    assert torch.equal(qmatmul.qmatmul(wide[:, :64], qw), plain)
    assert torch.equal(qmatmul.qmatmul(x.t().contiguous().t(), qw), plain)
    assert qmatmul.qmatmul(x[:0], qw).shape == (0, 40)


def test_pack_takes_whole_groups_of_8_rows():
    _, qw = _case(1, 24, 64, "q4_1")
    packed = qmatmul.pack(qw)
    assert packed.layout == "x8" and qmatmul.pack(packed) is packed
    assert torch.equal(dequantize(packed), dequantize(qw))
    _, odd = _case(1, 20, 64, "q4_1")
    assert qmatmul.pack(odd) is odd


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_layouts_agree_within_float_rounding(fmt):
    x, qw = _case(5, 48, 256, fmt, seed=10)
    torch.testing.assert_close(qmatmul.qmatmul(x, qmatmul.pack(qw)), qmatmul.qmatmul(x, qw),
                               atol=1e-5, rtol=1e-5)


def test_reference_runs_without_the_kernel(monkeypatch):
    x, qw = _case(3, 16, 64, "q4_0", seed=9)
    monkeypatch.setattr(qmatmul, "_kernel", lambda: None)
    out = qmatmul.qmatmul(x, qw, torch.ones(16))
    torch.testing.assert_close(out, qmatmul.reference_qmatmul(x, qw) + 1)


def test_typed_errors():
    x, qw = _case(2, 16, 64, "q8_0")
    with pytest.raises(QuantizationError, match="QuantizedWeight"):
        qmatmul.qmatmul(x, torch.zeros(16, 64))
    with pytest.raises(QuantizationError, match="float32 or bfloat16"):
        qmatmul.qmatmul(x.double(), qw)
    with pytest.raises(QuantizationError, match=r"shape \(M, 64\)"):
        qmatmul.qmatmul(x[:, :32], qw)
    with pytest.raises(QuantizationError, match=r"shape \(M, 64\)"):
        qmatmul.qmatmul(x[0], qw)
    with pytest.raises(QuantizationError, match="bias"):
        qmatmul.qmatmul(x, qw, torch.zeros(15))
    with pytest.raises(QuantizationError, match="out"):
        qmatmul.qmatmul(x, qw, out=torch.empty(2, 15))
    with pytest.raises(QuantizationError, match="out"):
        qmatmul.qmatmul(x, qw, out=torch.empty(2, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError):  # QuantizationError is a ValueError
        qmatmul.qmatmul(x, qw, torch.zeros(16, dtype=torch.int64))


def test_forcing_an_unknown_variant_is_a_typed_error(variant):
    variant("amx")
    with pytest.raises(QuantizationError, match="amx"):
        qmatmul.kernel_variant()
