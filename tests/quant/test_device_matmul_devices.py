"""Quantized linears on a real accelerator (skipped without one, saying why): the device
product of ``QuantizedLinear`` (``quant.device_matmul``) against the float product of the
de-quantized weight, for q4_0 / q4_1 / q8_0, with and without bias, M = 1 and 17, K = 96
(not a multiple of 128) and 4096, N not a multiple of 8. On CUDA the 4-bit formats must run
``_weight_int4pack_mm`` (sm80+); on an NPU ``npu_weight_quant_batchmatmul`` (untested on
hardware when written)."""

from __future__ import annotations

import pytest
import torch

from langchain_ascend.quant import device_matmul, formats
from langchain_ascend.quant.linear import QuantizedLinear
from langchain_ascend.testing import accelerator_params

DEVICES = accelerator_params()


def _expected_class(device: str, fmt: str) -> type:
    if device == "npu":
        return device_matmul.NPUMatmul
    if fmt != "q8_0" and torch.cuda.get_device_capability() >= (8, 0):
        return device_matmul.CUDAInt4Matmul
    return device_matmul.DenseMatmul


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("shape", [(44, 96), (1000, 4096)])
def test_device_product_matches_the_float_reference(device, fmt, shape):
    generator = torch.Generator().manual_seed(0)
    n, k = shape
    qw = formats.quantize(torch.randn(n, k, generator=generator), fmt)
    bias = torch.randn(n, generator=generator)
    for with_bias in (False, True):
        layer = QuantizedLinear(qw, bias if with_bias else None).to(device=device)
        assert isinstance(layer.device_product, _expected_class(device, fmt))
        for rows in (1, 17):
            for dtype in (torch.bfloat16, torch.float16):
                x = torch.randn(rows, k, generator=generator).to(dtype)  # (M, K)
                expected = x.float() @ formats.dequantize(qw).T  # (M, N)
                if with_bias:
                    expected = expected + bias
                out = layer(x.to(device))
                assert out.dtype == dtype and out.device.type == device
                tol = 0.02 * expected.abs().max().item()
                torch.testing.assert_close(out.float().cpu(), expected, rtol=0, atol=tol)
