"""The fused RMSNorm swap: same values as transformers' module (bit for bit through torch's op, to
rounding through the native kernel), only for known float32 norms."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.cpu.fused_norms import fuse_rms_norms, is_fusable
from langchain_ascend.native import rms_norm as native_rms_norm
from langchain_ascend.testing import needs_native_kernels

IDS = torch.tensor([[5, 17, 300, 41, 9, 1000, 77, 3]])


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_fused_norms_give_bit_identical_logits_through_torch(tiny_model_paths, arch, monkeypatch):
    monkeypatch.setattr(native_rms_norm, "rms_norm", lambda *args, **kwargs: None)  # torch's op only
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    with torch.inference_mode():
        before = model(IDS).logits
        swapped = len(fuse_rms_norms(model))
        after = model(IDS).logits
    assert swapped == len(norms) > 0  # qwen3 also has per-head q/k norms
    assert all("forward" in m.__dict__ for m in norms)
    assert torch.equal(before, after)
    assert fuse_rms_norms(model) == []  # already swapped: nothing changes twice


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_fused_norms_through_the_native_kernel_match_to_rounding(tiny_model_paths, arch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)
    calls = []
    kernel = native_rms_norm.rms_norm
    with torch.inference_mode():
        before = model(IDS[:, :1]).logits  # one token: every norm sees one row
        fuse_rms_norms(model)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(native_rms_norm, "rms_norm",
                          lambda *args, **kw: calls.append(args[0].shape) or kernel(*args, **kw))
            after = model(IDS[:, :1]).logits
    assert calls  # the kernel ran (and did not decline)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert torch.equal(after.argmax(-1), before.argmax(-1))


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_bf16_norms_through_the_native_kernel_are_bit_identical(tiny_model_paths, arch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.bfloat16)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    calls = []
    kernel = native_rms_norm.rms_norm_bf16
    with torch.inference_mode():
        before = [model(IDS).logits, model(IDS[:, :1]).logits]
        assert len(fuse_rms_norms(model)) == len(norms) > 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(native_rms_norm, "rms_norm_bf16",
                          lambda *args, **kw: calls.append(args[0].shape) or kernel(*args, **kw))
            after = [model(IDS).logits, model(IDS[:, :1]).logits]
    assert calls
    for got, want in zip(after, before, strict=True):
        assert torch.equal(got, want)


def test_other_dtypes_and_unknown_norms_keep_their_forward(tiny_model_paths, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.float16)
    assert fuse_rms_norms(model) == []
    monkeypatch.setattr(native_rms_norm, "available", lambda: False)  # no bf16 kernel here
    assert fuse_rms_norms(model.to(torch.bfloat16)) == []

    class GemmaStyleRMSNorm(torch.nn.Module):  # (1 + weight) scaling: not the same formula
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4))
            self.variance_epsilon = 1e-6

    assert not is_fusable(GemmaStyleRMSNorm())
