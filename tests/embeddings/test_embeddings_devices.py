"""AscendEmbeddings on a real accelerator matches the CPU vectors (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_ascend import AscendEmbeddings
from langchain_ascend.testing import accelerator_params, minilm_path

DEVICES = accelerator_params()
TEXTS = ["a short one", "北京今天天气晴朗。" * 5, "def f(x):\n    return x" * 10, "longer " * 300]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("float16", 5e-3)])
def test_device_vectors_match_cpu(device, dtype, tolerance) -> None:
    cpu = AscendEmbeddings(model=str(minilm_path()), device="cpu")
    dev = AscendEmbeddings(model=str(minilm_path()), device=device, dtype=dtype)
    tensor = dev.embed_documents_tensor(TEXTS)
    assert tensor.device.type == device and tensor.dtype.is_floating_point
    np.testing.assert_allclose(tensor.cpu().numpy(), np.array(cpu.embed_documents(TEXTS)),
                               atol=tolerance)
    np.testing.assert_allclose(dev.embed_query("hello"), cpu.embed_query("hello"),
                               atol=tolerance)
