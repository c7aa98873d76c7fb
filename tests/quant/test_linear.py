"""QuantizedLinear / QuantizedEmbedding / replace_linears against de-quantize-then-float math."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from langchain_ascend.quant import formats, linear
from langchain_ascend.quant.embedding import QuantizedEmbedding
from langchain_ascend.quant.linear import (
    QuantizedLinear,
    quantized_weight_bytes,
    reference_matmul,
    replace_linears,
)

FORMATS = ("q4_0", "q4_1", "q8_0")


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=generator)  # (N, K)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fallback_equals_dequantized_linear(fmt: str) -> None:
    qw = formats.quantize(_weight(48, 96), fmt)
    bias = torch.randn(48)
    layer = QuantizedLinear(qw, bias)
    layer.use_native = False
    x = torch.randn(2, 5, 96)  # (B, T, K)
    expected = torch.nn.functional.linear(x, formats.dequantize(qw), bias)  # (B, T, N)
    out = layer(x)
    assert out.shape == (2, 5, 48) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_fallback_chunks_output_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of output rows give the same product as one de-quantized weight."""
    qw = formats.quantize(_weight(70, 64, seed=1), "q4_1")
    x = torch.randn(3, 64)  # (M, K)
    whole = reference_matmul(x, qw)
    monkeypatch.setattr(linear, "FALLBACK_CHUNK_VALUES", 64 * 16)  # 16 rows a slice
    bias = torch.randn(70)
    chunked = reference_matmul(x, qw, bias)
    torch.testing.assert_close(chunked, whole + bias, rtol=1e-5, atol=1e-5)


def test_returns_the_input_dtype() -> None:
    qw = formats.quantize(_weight(32, 64), "q8_0")
    layer = QuantizedLinear(qw)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    expected = layer(x.float())  # the same values in float32
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def test_native_kernel_where_built() -> None:
    """The native path is ``native.qmatmul`` (int8 activations): equal to its own torch
    reference, and within the activation rounding of the weights-only float product."""
    native = pytest.importorskip("langchain_ascend.native.qmatmul")
    if not native.available():
        pytest.skip("the native qmatmul kernel is not built here")
    for fmt in FORMATS:
        qw = formats.quantize(_weight(64, 128, seed=3), fmt)
        layer = QuantizedLinear(qw)
        x = torch.randn(3, 128)
        out = layer(x)
        torch.testing.assert_close(out, native.reference_qmatmul(x, qw), rtol=1e-4, atol=1e-3)
        floats = reference_matmul(x, qw)
        assert (out - floats).abs().max() <= 0.03 * floats.abs().max()
        assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_rejects_a_wrong_width_and_bias() -> None:
    qw = formats.quantize(_weight(32, 64), "q8_0")
    with pytest.raises(ValueError, match="bias"):
        QuantizedLinear(qw, torch.zeros(31))
    with pytest.raises(ValueError, match="input of shape"):
        QuantizedLinear(qw)(torch.zeros(2, 32))


def test_replace_linears_swaps_planned_layers_and_frees_their_weights() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))
    x = torch.randn(2, 64)
    old_weight = weakref.ref(model[0].weight)
    bias = model[0].bias.detach().clone()
    planned = {"0": formats.quantize(model[0].weight.detach(), "q8_0")}
    names = replace_linears(model, lambda name, _layer: planned.get(name))
    assert names == ["0"]
    assert linear.use_reference(model) == 1
    assert isinstance(model[0], QuantizedLinear) and isinstance(model[2], nn.Linear)
    torch.testing.assert_close(model[0].bias.detach(), bias)
    gc.collect()
    assert old_weight() is None
    expected = torch.nn.functional.linear(x, formats.dequantize(planned["0"]), bias)
    torch.testing.assert_close(model[0](x), expected, rtol=1e-4, atol=1e-4)


def test_replace_linears_rejects_a_wrong_shape() -> None:
    model = nn.Sequential(nn.Linear(64, 32))
    wrong = formats.quantize(_weight(16, 64), "q8_0")
    with pytest.raises(ValueError, match="planned weight"):
        replace_linears(model, lambda _name, _layer: wrong)


@pytest.mark.parametrize("fmt", FORMATS)
def test_embedding_rows_are_the_dequantized_rows(fmt: str) -> None:
    qw = formats.quantize(_weight(100, 64, seed=2), fmt)
    table = formats.dequantize(qw)  # (V, D)
    embedding = QuantizedEmbedding(qw, dtype=torch.bfloat16)
    ids = torch.tensor([[3, 99, 0], [3, 5, 7]])
    out = embedding(ids)
    assert out.shape == (2, 3, 64) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, table[ids].to(torch.bfloat16))
    assert embedding(torch.zeros(0, dtype=torch.long)).shape == (0, 64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_lookups_from_kept_rows_are_the_batch_lookups_values(fmt: str,
                                                                   monkeypatch) -> None:
    monkeypatch.setattr("langchain_ascend.quant.embedding.KEPT_ROWS_BYTES", 4 * 64 * 20)
    qw = formats.quantize(_weight(100, 64, seed=3), fmt)
    embedding = QuantizedEmbedding(qw, scale=1.5)
    batch = embedding(torch.arange(100))  # (100, D): one de-quantization, nothing kept
    assert embedding._kept == {}
    for ids in ([7], [7, 9, 7], [50], list(range(30, 46)), [7]):
        out = embedding(torch.tensor([ids]))[0]  # (T, D) through the kept rows
        assert torch.equal(out, batch[ids])
        out.add_(1.0)  # the caller owns what it gets: the kept rows do not change
        assert torch.equal(embedding(torch.tensor(ids)), batch[ids])
    assert 0 < len(embedding._kept) <= 20  # the bound holds; the oldest rows made room


def test_shared_blocks_are_counted_once() -> None:
    qw = formats.quantize(_weight(64, 32), "q8_0")
    model = nn.ModuleDict({"embed": QuantizedEmbedding(qw), "head": QuantizedLinear(qw),
                           "other": QuantizedLinear(formats.quantize(_weight(8, 32), "q4_0"))})
    assert quantized_weight_bytes(model) == formats.nbytes(qw) + 8 * 18


@pytest.mark.parametrize("fmt", FORMATS)
def test_x8_layout(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights re-laid in x8 (8 output rows interleaved): the fallback slices whole groups,
    the layout survives a new ``blocks`` buffer, an embedding keeps the file's layout."""
    qw = formats.quantize(_weight(48, 64, seed=4), fmt)
    x8 = formats.to_layout(qw, "x8")
    x = torch.randn(3, 64)
    expected = torch.nn.functional.linear(x, formats.dequantize(qw))
    monkeypatch.setattr(linear, "FALLBACK_CHUNK_VALUES", 64 * 12)  # 12 rows -> 8-row slices
    layer = QuantizedLinear(x8)
    layer.use_native = False
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    layer.blocks = x8.blocks.clone()
    assert layer.qweight.layout == "x8" and layer.qweight.blocks is layer.blocks
    embedding = QuantizedEmbedding(x8)
    assert embedding.qweight.layout == "gguf"
    torch.testing.assert_close(embedding(torch.tensor([0, 47])), formats.dequantize(qw)[[0, 47]])
