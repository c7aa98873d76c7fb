"""Captured decode graphs vs the eager step on a real accelerator (skipped without one).

On CUDA (``torch.cuda.CUDAGraph``) and Ascend (``torch.npu.NPUGraph``, untested on hardware):
greedy tokens of ``compile=True`` (graphs captured at ``warmup()``) equal the eager step's
for batch 1 and batch 3 (padded to the bucket of 4), qwen2 / llama / qwen3 tiny models, and
every bucket captured.
"""

from __future__ import annotations

import pytest
import torch

from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing import ARCHITECTURES, accelerator_params, build_model
from langchain_ascend.testing.runner_steps import greedy_decode

BLOCK = 16


def generate(runner, prompts, num_new=12):
    width = -(-(max(map(len, prompts)) + num_new + 1) // BLOCK)
    return greedy_decode(runner, prompts, num_new, blocks_per_request=width)


@pytest.mark.parametrize("device", accelerator_params())
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_captured_decode_equals_eager(device, arch, dtype):
    path = str(build_model("tiny", arch))
    kwargs = dict(device=device, dtype=dtype, block_size=128 if device == "npu" else BLOCK,
                  num_blocks=64, max_batch_size=8)
    # float32: against the eager step itself; bfloat16: against the same static step run
    # eagerly (the eager step's other attention kernels may round differently in bf16).
    eager = ModelRunner.load(path, compile=False if dtype == "float32" else "static", **kwargs)
    captured = ModelRunner.load(path, compile=True, **kwargs)
    captured.warmup()
    graphs = captured.compiler.graphs
    assert graphs is not None and not graphs.failures, graphs and graphs.failures
    gen = torch.Generator().manual_seed(0)
    for lengths in ([9], [3, 40, 17]):
        prompts = [torch.randint(0, 4000, (n,), generator=gen).tolist() for n in lengths]
        assert generate(captured, prompts) == generate(eager, prompts)
    assert captured.compiler.enabled, captured.compiler.failure
