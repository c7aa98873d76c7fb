"""Quantized linears' device products without a device (``quant.device_matmul``).

* The pure mappings: each backend's integers, scales and offsets, put through the op's
  documented de-quantization, give ``formats.dequantize`` (to float32 rounding, and to the
  rounding of fp16 / bf16 scales), q4_1's degenerate blocks included.
* The NPU wiring: a CPU stand-in for torch_npu whose ``npu_convert_weight_to_int4pack`` and
  ``npu_weight_quant_batchmatmul`` check the documented shapes, dtypes and ranges (raising on
  a violation) and compute the documented formula; ``QuantizedLinear`` on a stand-in NPU must
  then equal the float product, converting once.
* The CUDA wiring: stand-ins for ``_convert_weight_to_int4pack`` / ``_weight_int4pack_mm``
  built on torch's CPU int4 kernels, which share the CUDA op's ``(u - 8) * scale + zero``.

Real-device parity lives in test_device_matmul_devices.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from langchain_ascend.errors import DeviceUnavailableError
from langchain_ascend.quant import device_matmul, formats, linear
from langchain_ascend.quant.linear import QuantizedLinear
from langchain_ascend.testing.random_blocks import random_blocks

FORMATS = ("q4_0", "q4_1", "q8_0")
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator)  # (N, K)
    return weight + 0.5 * torch.randn(rows, cols // 32, 1, generator=generator).repeat(
        1, 1, 32).reshape(rows, cols)  # offset blocks: q4_1 mins far from 0


def _rounding_bound(qw: formats.QuantizedWeight, unit: float) -> torch.Tensor:
    """Per weight: ``2 u (|w| + |m + 8 d|)``, the rounding of ``(v + o) s`` with ``s`` and ``o``
    each rounded to a relative ``u`` (``o s = m + 8 d``)."""
    _, d, m = formats.unpack(qw)  # (N, B), (N, B)
    offset = torch.zeros_like(d) if m is None else (m + 8 * d).abs()  # (N, B)
    return 2 * unit * (formats.dequantize(qw).abs() + offset.repeat_interleave(32, dim=1))


def _q4_1(blocks: list[tuple[float, float, list[int]]]) -> formats.QuantizedWeight:
    """A one-row q4_1 weight from ``(d, m, 32 nibbles)`` per block."""
    raw = []
    for d, m, q in blocks:
        nibbles = torch.tensor(q, dtype=torch.uint8)
        raw.append(torch.cat([torch.tensor([d, m], dtype=torch.float16).view(torch.uint8),
                              nibbles[:16] | (nibbles[16:] << 4)]))
    return formats.QuantizedWeight("q4_1", 1, 32 * len(blocks), torch.cat(raw)[None])


# ---- the pure mappings -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["gguf", "x8"])
def test_npu_groups_reproduce_dequantize(fmt: str, layout: str) -> None:
    qw = formats.to_layout(formats.quantize(_weight(48, 160), fmt), layout)
    expected = formats.dequantize(qw)  # (N, K)
    groups = device_matmul.npu_groups(qw)
    assert groups.values.shape == (160, 48) and groups.scale.shape == (5, 48)
    assert groups.values.dtype == (torch.int8 if fmt == "q8_0" else torch.int32)
    if fmt != "q8_0":
        assert -8 <= int(groups.values.min()) and int(groups.values.max()) <= 7
    assert (groups.offset is None) == (fmt != "q4_1")
    torch.testing.assert_close(device_matmul.npu_dequantized(groups), expected,
                               rtol=1e-6, atol=1e-6)
    for dtype, unit in UNIT_ROUNDOFF.items():  # scales and offsets in x's dtype, as the op has
        rounded = device_matmul.NPUGroups(
            groups.values, groups.scale.to(dtype).float(),
            None if groups.offset is None else groups.offset.to(dtype).float())
        error = (device_matmul.npu_dequantized(rounded) - expected).abs()
        assert bool((error <= _rounding_bound(qw, unit)).all()), (dtype, error.max())


def test_npu_q4_1_degenerate_blocks_become_constants() -> None:
    """d == 0: weight 0, scale m, offset 1 -> exactly m whatever the nibbles; a scale so small
    that m/d + 8 would overflow fp16: the constant m + 7.5 d, within 7.5 |d| of each value."""
    tiny = 2.0 ** -20  # fp16 subnormal; m / d = 3 * 2**20
    qw = _q4_1([(0.0, 0.375, list(range(16)) * 2), (tiny, 3.0, [15] * 16 + [0] * 16),
                (0.25, -1.5, list(range(16)) * 2)])
    groups = device_matmul.npu_groups(qw)
    assert groups.offset is not None
    assert groups.offset[:, 0].tolist() == [1.0, 1.0, -1.5 / 0.25 + 8]
    assert bool((groups.values[:64] == 0).all())
    assert groups.scale[:, 0].tolist()[0] == 0.375
    expected = formats.dequantize(qw)[0]  # (96,)
    got = device_matmul.npu_dequantized(groups)[0]  # (96,)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # m is fp16: exact in each
        half = device_matmul.NPUGroups(groups.values, groups.scale.to(dtype).float(),
                                       groups.offset.to(dtype).float())
        assert device_matmul.npu_dequantized(half)[0, :32].tolist() == [0.375] * 32
    assert (got[32:64] - expected[32:64]).abs().max() <= 7.5 * tiny
    torch.testing.assert_close(got[64:], expected[64:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1"])
def test_cuda_groups_reproduce_dequantize(fmt: str) -> None:
    qw = formats.quantize(_weight(40, 96, seed=2), fmt)
    expected = formats.dequantize(qw)  # (N, K)
    groups = device_matmul.cuda_groups(qw)
    assert groups.nibbles.shape == (40, 96) and groups.scale.shape == (3, 40)
    assert 0 <= int(groups.nibbles.min()) and int(groups.nibbles.max()) <= 15
    torch.testing.assert_close(device_matmul.cuda_dequantized(groups), expected,
                               rtol=1e-6, atol=1e-6)
    bf16 = device_matmul.CUDAGroups(groups.nibbles, groups.scale.bfloat16().float(),
                                    groups.zero.bfloat16().float())
    error = (device_matmul.cuda_dequantized(bf16) - expected).abs()
    assert bool((error <= _rounding_bound(qw, UNIT_ROUNDOFF[torch.bfloat16])).all())
    packed = device_matmul.cuda_nibble_bytes(groups.nibbles)  # (N, K/2): even k high
    assert packed.dtype == torch.uint8 and packed.shape == (40, 48)
    assert torch.equal((packed >> 4).int(), groups.nibbles[:, 0::2])
    assert torch.equal((packed & 0xF).int(), groups.nibbles[:, 1::2])
    with pytest.raises(ValueError, match="q8_0"):
        device_matmul.cuda_groups(formats.quantize(_weight(8, 32), "q8_0"))


def test_cuda_scales_and_zeros_through_torchs_cpu_int4_kernel() -> None:
    """torch's CPU int4 kernel reads ``scales_and_zeros`` as the CUDA one does: our q4_1
    mapping through it gives the float product to bf16 rounding."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("this torch has no CPU int4 kernel")
    qw = formats.quantize(_weight(32, 96, seed=4), "q4_1")  # the CPU kernel: N % 16 == 0
    groups = device_matmul.cuda_groups(qw)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.nibbles, 1)
    scales_and_zeros = torch.stack([groups.scale, groups.zero], -1).bfloat16()  # (B, N, 2)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1)).bfloat16()  # (M, K)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)
    expected = x.float() @ formats.dequantize(qw).T  # (M, N)
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2 * 96 ** 0.5)


# ---- a stand-in torch_npu ----------------------------------------------------------------------
def _fake_convert(weight, inner_k_tiles=0):
    if weight.dtype != torch.int32 or weight.dim() != 2 or not weight.is_contiguous():
        raise RuntimeError(f"int4pack: int32 contiguous 2-D only, got {weight.dtype}")
    if weight.shape[-1] % 8 or int(weight.min()) < -8 or int(weight.max()) > 7:
        raise RuntimeError("int4pack: last dim % 8 and values in [-8, 7]")
    nibbles = (weight.long() & 0xF).reshape(weight.shape[0], -1, 8)  # (K, N/8, 8)
    word = (nibbles << (4 * torch.arange(8))).sum(-1)  # (K, N/8) in [0, 2**32)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def _unpack_int4(packed):
    shifts = 4 * torch.arange(8)
    nibbles = ((packed.long() & 0xFFFFFFFF)[..., None] >> shifts) & 0xF  # (K, N/8, 8)
    values = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return values.reshape(packed.shape[0], -1)  # (K, N)


def _fake_wqbmm(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0):
    calls.append(dict(x=x, weight=weight, scale=antiquant_scale, offset=antiquant_offset,
                      bias=bias, group=antiquant_group_size))
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"x must be (M, K) fp16/bf16, got {x.dtype} {tuple(x.shape)}")
    if quant_scale is not None or quant_offset is not None or inner_precise not in (0, 1):
        raise RuntimeError("unexpected output quantization / mode")
    k = x.shape[1]
    if weight.dtype == torch.int8:
        values = weight
    elif weight.dtype == torch.int32:
        values = _unpack_int4(weight)
    else:
        raise RuntimeError(f"weight must be int8 or int32, got {weight.dtype}")
    n = values.shape[1]
    if values.shape[0] != k or not (1 <= k <= 65535 and 1 <= n <= 65535):
        raise RuntimeError(f"K/N: x {tuple(x.shape)} weight {tuple(values.shape)}")
    group = antiquant_group_size
    if group:
        if group % 32 or not 32 <= group <= k - 1:
            raise RuntimeError(f"group size {group} for K={k}")
        want = (-(-k // group), n)
    else:
        want = (1, n)
    if antiquant_scale.dtype != x.dtype or tuple(antiquant_scale.shape) != want:
        raise RuntimeError(f"scale {antiquant_scale.dtype} {tuple(antiquant_scale.shape)}")
    if antiquant_offset is not None and (antiquant_offset.dtype != x.dtype
                                         or antiquant_offset.shape != antiquant_scale.shape):
        raise RuntimeError("offset must match the scale")
    if bias is not None:
        bias_dtype = torch.float32 if x.dtype == torch.bfloat16 else torch.float16
        if bias.dtype != bias_dtype or tuple(bias.shape) not in ((n,), (1, n)):
            raise RuntimeError(f"bias {bias.dtype} {tuple(bias.shape)}")
    rows = group or k
    scale = antiquant_scale.float().repeat_interleave(rows, 0)[:k]  # (K, N)
    w = values.float()
    if antiquant_offset is not None:
        w = w + antiquant_offset.float().repeat_interleave(rows, 0)[:k]
    out = x.float() @ (w * scale)  # (M, N)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


calls: list[dict] = []


@pytest.fixture
def fake_npu(monkeypatch):
    """torch_npu replaced by the stand-in, and the CPU treated as an NPU."""
    return _install_fake_npu(monkeypatch)


def _install_fake_npu(monkeypatch):
    module = types.ModuleType("torch_npu")
    module.npu_convert_weight_to_int4pack = _fake_convert
    module.npu_weight_quant_batchmatmul = _fake_wqbmm
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(device_matmul, "backend_for",
                        lambda device: "npu" if device.type == "cpu" else device.type)
    calls.clear()
    return module


def _reference(x, qw, bias):
    out = x.float() @ formats.dequantize(qw).T  # (M, N)
    return out if bias is None else out + bias.float()


def _close(out, expected, dtype):
    scale = expected.abs().max().item()
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=0.02 * scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_npu_product_matches_the_float_reference(fake_npu, fmt, with_bias, rows, dtype):
    qw = formats.quantize(_weight(44, 96, seed=rows), fmt)  # K = 96: not a multiple of 128
    bias = torch.randn(44) if with_bias else None
    layer = QuantizedLinear(qw, bias)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = layer(x)
    _close(out, _reference(x, qw, bias), dtype)
    (call,) = calls
    assert call["group"] == 32 and call["x"].dtype == dtype
    assert call["weight"].dtype == (torch.int8 if fmt == "q8_0" else torch.int32)
    assert call["weight"].shape == ((96, 44) if fmt == "q8_0" else (96, 48 // 8))  # N padded
    assert call["scale"].shape == (3, 44 if fmt == "q8_0" else 48)
    assert (call["offset"] is not None) == (fmt == "q4_1")
    assert (call["bias"] is not None) == with_bias


def test_npu_converts_once_when_moved(fake_npu, monkeypatch):
    converted = []
    monkeypatch.setattr(fake_npu, "npu_convert_weight_to_int4pack",
                        lambda w, inner_k_tiles=0: converted.append(1) or _fake_convert(w))
    qw = formats.quantize(_weight(32, 64), "q4_1")
    layer = QuantizedLinear(qw, torch.randn(32).bfloat16()).to("cpu")  # the "move"
    assert converted == [1] and isinstance(layer.device_product, device_matmul.NPUMatmul)
    x = torch.randn(2, 64).bfloat16()
    for _ in range(3):
        layer(x)
    assert converted == [1] and len(calls) == 3
    layer(x.half())  # another dtype: converted once more, then kept
    layer(x.half())
    assert converted == [1, 1] and layer.device_product.dtype == torch.float16


def test_npu_wide_outputs_run_in_column_chunks(fake_npu, monkeypatch):
    monkeypatch.setattr(device_matmul, "NPU_CHUNK_COLUMNS", 16)
    qw = formats.quantize(_weight(44, 64, seed=5), "q4_0")
    bias = torch.randn(44)
    x = torch.randn(3, 64).bfloat16()
    _close(QuantizedLinear(qw, bias)(x), _reference(x, qw, bias), torch.bfloat16)
    assert [c["scale"].shape[1] for c in calls] == [16, 16, 16]  # 44 = 16 + 16 + 12 (+4 pad)


def test_npu_single_group_runs_per_channel(fake_npu):
    """K == 32: the op's group size must lie in [32, K - 1], so one group runs as per-channel
    scales (group size 0, the same (1, N) scales)."""
    qw = formats.quantize(_weight(16, 32, seed=6), "q8_0")
    x = torch.randn(4, 32).half()
    _close(QuantizedLinear(qw)(x), _reference(x, qw, None), torch.float16)
    assert calls[0]["group"] == 0 and calls[0]["scale"].shape == (1, 16)


def test_npu_float32_activations_run_in_bf16(fake_npu):
    qw = formats.quantize(_weight(16, 64), "q4_0")
    x = torch.randn(2, 64)
    out = QuantizedLinear(qw)(x)
    assert out.dtype == torch.float32 and calls[0]["x"].dtype == torch.bfloat16
    _close(out, _reference(x, qw, None), torch.float32)


def test_npu_without_torch_npu_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` fail
    monkeypatch.setattr(device_matmul, "backend_for", lambda device: "npu")
    with pytest.raises(DeviceUnavailableError, match="torch_npu"):
        QuantizedLinear(formats.quantize(_weight(8, 32), "q4_0"))(torch.randn(1, 32).half())


def test_the_stand_in_rejects_what_the_docs_forbid(fake_npu):
    x = torch.randn(2, 64).half()
    weight = torch.zeros(64, 8, dtype=torch.int8)
    scale = torch.ones(2, 8).half()
    _fake_wqbmm(x, weight, scale, antiquant_group_size=32)
    for bad in (dict(x=x.float()), dict(scale=scale.bfloat16()), dict(group=64),
                dict(group=48), dict(scale=torch.ones(1, 8).half()),
                dict(bias=torch.zeros(8))):
        args = dict(x=x, scale=scale, group=32) | bad
        with pytest.raises(RuntimeError):
            _fake_wqbmm(args["x"], weight, args["scale"], bias=args.get("bias"),
                        antiquant_group_size=args["group"])
    with pytest.raises(RuntimeError):
        _fake_convert(torch.full((4, 8), 8, dtype=torch.int32))
    with pytest.raises(RuntimeError):
        _fake_convert(torch.zeros(4, 12, dtype=torch.int32))


# ---- CUDA wiring through torch's CPU int4 kernels ------------------------------------------------
@pytest.fixture
def fake_cuda(monkeypatch):
    """The CPU treated as an sm80+ GPU; the CUDA int4 ops replaced by checks plus torch's CPU
    int4 kernels."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("this torch has no CPU int4 kernel")
    seen: list[dict] = []

    def convert(packed, inner_k_tiles):
        assert packed.dtype == torch.uint8 and packed.is_contiguous() and packed.shape[0] % 8 == 0
        assert inner_k_tiles in (2, 4, 8) and (2 * packed.shape[1]) % (16 * inner_k_tiles) == 0
        nibbles = torch.stack([packed >> 4, packed & 0xF], -1).reshape(packed.shape[0], -1)
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles.int(), 1)

    def mm(x, weight, group_size, scales_and_zeros):
        seen.append(dict(x=x, group=group_size, sz=scales_and_zeros))
        assert x.dtype == torch.bfloat16 and x.is_contiguous() and group_size == 32
        assert scales_and_zeros.dtype == torch.bfloat16
        assert scales_and_zeros.shape == (x.shape[1] // 32, weight.shape[0], 2)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight, group_size,
                                                          scales_and_zeros)

    monkeypatch.setattr(torch.ops.aten, "_convert_weight_to_int4pack", convert)
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm", mm)
    monkeypatch.setattr(device_matmul, "backend_for",
                        lambda device: "cuda" if device.type == "cpu" else device.type)
    monkeypatch.setattr(device_matmul, "_cuda_has_int4", lambda device: True)
    return seen


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 17])
def test_cuda_product_matches_the_float_reference(fake_cuda, fmt, rows):
    qw = formats.quantize(_weight(44, 96, seed=rows), fmt)
    bias = torch.randn(44)
    layer = QuantizedLinear(qw, bias).to("cpu")
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(7)).bfloat16()
    _close(layer(x), _reference(x, qw, bias), torch.bfloat16)
    if fmt == "q8_0":  # no per-group int8 op: de-quantized once
        assert isinstance(layer.device_product, device_matmul.DenseMatmul) and not fake_cuda
        assert layer.device_product.weight.dtype == torch.bfloat16
    else:
        assert isinstance(layer.device_product, device_matmul.CUDAInt4Matmul)
        assert layer.device_product.inner_k_tiles == 2 and len(fake_cuda) == 1


def test_cuda_inner_k_tiles():
    assert [device_matmul.cuda_inner_k_tiles(k) for k in (32, 64, 96, 128, 4096)] == [
        2, 4, 2, 8, 8]


def test_a_whole_model_moved_to_the_stand_in_npu(monkeypatch, tiny_model_paths):
    """A tiny qwen2 (q/k/v biases) with every linear q4_1, moved to the stand-in NPU: each
    layer converted once at the move (for the device's default dtype, bf16, where a layer has
    no bias to tell), logits within bf16 rounding of the weights-only reference on the CPU."""
    from transformers import AutoModelForCausalLM

    from langchain_ascend.quant.linear import replace_linears, use_reference

    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.bfloat16)
    replace_linears(model, lambda name, layer: formats.quantize(layer.weight.data, "q4_1"))
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    ids = torch.tensor([[3, 17, 99, 5, 42, 8]])
    use_reference(model)
    with torch.no_grad():
        expected = model(ids).logits.float()  # (1, T, V) through reference_matmul, on the CPU
    _install_fake_npu(monkeypatch)  # after loading: transformers probes torch_npu's spec
    monkeypatch.setattr(linear, "default_dtype", lambda device: torch.bfloat16)  # as a 910B
    model.to("cpu")  # the "move": every layer converted here
    assert all(isinstance(m.device_product, device_matmul.NPUMatmul) for m in layers)
    converted = [m.device_product for m in layers]
    with torch.no_grad():
        out = model(ids).logits.float()
    assert [m.device_product for m in layers] == converted and len(calls) == len(layers)
    assert any(c["bias"] is not None for c in calls)
    torch.testing.assert_close(out, expected, rtol=0, atol=0.05 * expected.abs().max().item())


def test_shapes_and_gpus_without_an_op_run_a_weight_dequantized_once(fake_npu, monkeypatch):
    """NPU K above the op's limit, and a GPU older than sm80: the weight de-quantized once to
    the activations' dtype, F.linear."""
    qw = formats.quantize(_weight(16, 96), "q4_1")
    x = torch.randn(3, 96).half()
    monkeypatch.setattr(device_matmul, "NPU_MAX_DIM", 64)
    layer = QuantizedLinear(qw)
    _close(layer(x), _reference(x, qw, None), torch.float16)
    assert isinstance(layer.device_product, device_matmul.DenseMatmul) and not calls
    assert layer.device_product.weight.dtype == torch.float16
    monkeypatch.setattr(device_matmul, "backend_for", lambda device: "cuda")
    monkeypatch.setattr(device_matmul, "_cuda_has_int4", lambda device: False)
    layer = QuantizedLinear(qw, torch.randn(16))
    _close(layer(x), _reference(x, qw, layer.bias.detach()), torch.float16)
    assert isinstance(layer.device_product, device_matmul.DenseMatmul)


@pytest.mark.parametrize("kind", ["npu", "cuda"])
@pytest.mark.parametrize("fmt", formats.FILE_FORMATS)
def test_file_formats_run_a_weight_dequantized_once_on_devices(fake_npu, monkeypatch, kind,
                                                               fmt, caplog):
    """Q5_0/Q5_1 and the K-quants (no device weight-only op takes their scales): the weight
    de-quantized once at the move, logged, F.linear."""
    monkeypatch.setattr(device_matmul, "backend_for", lambda device: kind)
    monkeypatch.setattr(device_matmul, "_cuda_has_int4", lambda device: True)
    monkeypatch.setattr(device_matmul, "_LOGGED", set(), raising=False)
    qw = random_blocks(fmt, 16, 256, seed=2)
    layer = QuantizedLinear(qw, torch.randn(16))
    x = torch.randn(3, 256).half()
    with caplog.at_level("INFO"):
        _close(layer(x), _reference(x, qw, layer.bias.detach()), torch.float16)
    assert isinstance(layer.device_product, device_matmul.DenseMatmul) and not calls
    assert torch.equal(layer.device_product.weight, formats.dequantize(qw).half())
    assert any(fmt in r.getMessage() and "de-quantized once" in r.getMessage()
               for r in caplog.records)
