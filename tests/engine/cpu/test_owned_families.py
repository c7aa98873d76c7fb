"""The owned CPU models of Gemma 2, Gemma 3 (``engine.cpu.models.gemma``) and Phi-3 (the
Llama-style layer over its fused weights, ``engine.cpu.models.llama``) on float HF folders: they
hold the weights and run every step with transformers' values; where a rotary scaling follows
the sequence length, transformers' forward runs instead (the GGUF files of these families:
``tests/quant/test_gguf_families.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _lean_steps import PROMPTS, assert_owned_matches_transformers, prepared_runner
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu.models.gemma import GemmaModel, gemma_norm
from langchain_ascend.engine.cpu.models.llama import LlamaModel, rotary_refusal
from langchain_ascend.testing import GEMMA_SLIDING_WINDOW, build_model, needs_native_kernels

GREEDY = SamplingParams(max_tokens=8)
OWNER = {"gemma3": GemmaModel, "gemma2": GemmaModel, "phi3": LlamaModel}


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return {arch: build_model("tiny", arch) for arch in OWNER}


def _hf_next_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]  # (V,)


@needs_native_kernels()
@pytest.mark.parametrize("arch", list(OWNER))
def test_the_owned_model_runs_prefill_and_decode_with_transformers_values(paths, arch,
                                                                         monkeypatch):
    runner = prepared_runner(paths[arch], torch.float32)
    owned = runner.hooks.owned_model
    assert isinstance(owned, OWNER[arch])
    assert runner.hooks.changes["owned_layers"] == runner.model.config.num_hidden_layers
    assert runner.weights["forward"] == "native"
    assert not any("forward" in m.__dict__ for m in runner.model.modules())  # none replaced
    steps: list[int] = []
    hidden = owned.hidden

    def spy(input_ids, position_ids, step):
        steps.append(input_ids.shape[1])
        return hidden(input_ids, position_ids, step)

    monkeypatch.setattr(owned, "hidden", spy)
    reference = AutoModelForCausalLM.from_pretrained(paths[arch], dtype=torch.float32)
    assert max(map(len, PROMPTS)) > GEMMA_SLIDING_WINDOW  # Gemma's local layers slide
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    prefill = runner.forward_batch([ScheduledSegment(f"r{i}", p, 0, tables[i], True, GREEDY)
                                    for i, p in enumerate(PROMPTS)])[1]  # (3, V)
    torch.testing.assert_close(prefill, torch.stack([_hf_next_logits(reference, p)
                                                     for p in PROMPTS]), atol=1e-4, rtol=1e-4)
    news = [7, 8, 9]
    got = runner.forward_batch([ScheduledSegment(f"r{i}", [news[i]], len(p), tables[i], True,
                                                 GREEDY) for i, p in enumerate(PROMPTS)])[1]
    want = torch.stack([_hf_next_logits(reference, p + [news[i]])
                        for i, p in enumerate(PROMPTS)])  # (3, V)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert steps == [sum(map(len, PROMPTS)), 3]  # both steps: the owned model


@needs_native_kernels()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", list(OWNER))
def test_owned_and_transformers_forwards_give_the_same_tokens(paths, arch, dtype):
    assert_owned_matches_transformers(paths[arch], dtype, OWNER[arch])


@pytest.mark.parametrize("arch", ["gemma3", "gemma2"])
def test_gemma_norm_is_transformers(paths, arch):
    model = AutoModelForCausalLM.from_pretrained(paths[arch], dtype=torch.float32)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    with torch.no_grad():
        for module in norms:
            module.weight.normal_()  # a tiny model's norms are all zero: 1 + w = 1
    for dtype in (torch.float32, torch.bfloat16):
        for module in norms:
            module.to(dtype)
            x = (3 * torch.randn(9, module.weight.shape[0])).to(dtype)
            with torch.inference_mode():
                got = gemma_norm(x, 1.0 + module.weight.float(), module.eps)
                tol = 1e-5 if dtype == torch.float32 else 1e-2
                torch.testing.assert_close(got, module(x), atol=tol, rtol=tol)


def test_rotary_refusal_names_what_the_kernel_cannot_rotate():
    full = SimpleNamespace(inv_freq=torch.ones(16), rope_type="default")
    assert rotary_refusal(full, 32) is None
    assert "partial rotary (24 of 32" in rotary_refusal(SimpleNamespace(
        inv_freq=torch.ones(12), rope_type="default"), 32)
    assert "'longrope'" in rotary_refusal(SimpleNamespace(
        inv_freq=torch.ones(16), rope_type="longrope"), 32)
    assert "'dynamic'" in rotary_refusal(SimpleNamespace(
        inv_freq=torch.ones(16), rope_type={"sliding_attention": "default",
                                            "full_attention": "dynamic"}), 32)
    assert "head width 40" in rotary_refusal(SimpleNamespace(
        inv_freq=torch.ones(20), rope_type="default"), 40)


def test_a_phi3_with_longrope_runs_transformers_forward(paths):
    """Phi-3's long-context rope switches frequencies with the sequence: not owned, and the
    HF forward still gives transformers' values."""
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config.from_pretrained(paths["phi3"])
    half = config.hidden_size // config.num_attention_heads // 2
    config.original_max_position_embeddings = config.max_position_embeddings // 2
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": [1.0] * half, "long_factor": [2.0] * half}
    torch.manual_seed(0)
    model = Phi3ForCausalLM(config).eval()
    prompt = [5, 17, 300, 41, 9]
    want = _hf_next_logits(model, prompt)
    from langchain_ascend.engine.worker.model_runner import ModelRunner

    runner = ModelRunner.from_model(model, num_blocks=16, block_size=4, compile=False,
                                    kv_cache_dtype="float32")
    assert runner.hooks.owned_model is None and runner.weights["forward"] == "transformers"
    got = runner.forward_batch([ScheduledSegment("a", prompt, 0, [0, 1], True, GREEDY)])[1]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)
