"""The fused RMSNorm swap: same values as transformers' module, only for known float32 norms."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.fused_norms import fuse_rms_norms, is_fusable


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_fused_norms_give_bit_identical_logits(tiny_model_paths, arch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)
    ids = torch.tensor([[5, 17, 300, 41, 9, 1000, 77, 3]])
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    with torch.inference_mode():
        before = model(ids).logits
        swapped = fuse_rms_norms(model)
        after = model(ids).logits
    assert swapped == len(norms) > 0  # qwen3 also has per-head q/k norms
    assert all("forward" in m.__dict__ for m in norms)
    assert torch.equal(before, after)
    assert fuse_rms_norms(model) == 0  # already swapped: nothing changes twice


def test_other_dtypes_and_unknown_norms_keep_their_forward(tiny_model_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.bfloat16)
    assert fuse_rms_norms(model) == 0

    class GemmaStyleRMSNorm(torch.nn.Module):  # (1 + weight) scaling: not the same formula
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4))
            self.variance_epsilon = 1e-6

    assert not is_fusable(GemmaStyleRMSNorm())
