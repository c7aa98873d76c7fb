"""The float16-screened greedy LM head: same token as the float32 argmax, used only where it
applies."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead, error_bound_scale
from langchain_ascend.engine.worker.hooks import PlainLogitsHead
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.native import matvec
from langchain_ascend.testing import needs_native_kernels

pytestmark = needs_native_kernels()


def random_head(vocab=4096, size=128, scale=0.05, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, size, generator=gen) * scale


def test_screened_logits_stay_within_the_bound():
    for seed, scale in ((0, 0.05), (1, 30.0), (2, 1e-6)):  # includes float16 subnormals
        weight = random_head(scale=scale, seed=seed)
        head = ScreenedGreedyHead(weight)
        bound = error_bound_scale(weight)
        for row in range(20):
            hidden = torch.randn(128, generator=torch.Generator().manual_seed(row)) * (row + 1)
            approx = head.approximate_logits(hidden).double()
            exact = weight.double() @ hidden.double()
            assert (approx - exact).abs().max() <= bound * hidden.double().norm()


def test_choice_equals_the_float32_argmax_on_random_rows():
    weight = random_head()
    head = ScreenedGreedyHead(weight)
    for row in range(300):
        hidden = torch.randn(128, generator=torch.Generator().manual_seed(row)) * (1 + row % 7)
        assert head.choose(hidden) == int((weight @ hidden).argmax())


def test_near_ties_float16_cannot_see_are_decided_in_float32():
    weight = random_head()
    hidden = torch.randn(128, generator=torch.Generator().manual_seed(5))
    winner = int((weight @ hidden).argmax())
    for nudge, expected_rival_wins in ((1e-4, True), (-1e-4, False)):
        rival = weight.clone()
        rival[17] = weight[winner] + nudge * hidden / hidden.norm() ** 2  # logit + nudge
        head = ScreenedGreedyHead(rival)
        assert head.choose(hidden) == (17 if expected_rival_wins else winner)
        assert head.last_candidates >= 2  # float16 could not separate them
    twins = weight.clone()
    twins[3] = weight[winner]  # an exact tie: the lowest id, like torch.argmax
    assert ScreenedGreedyHead(twins).choose(hidden) == min(3, winner)


def test_non_finite_rows_and_out_of_range_weights_are_declined():
    head = ScreenedGreedyHead(random_head())
    assert head.choose(torch.full((128,), float("nan"))) is None
    with pytest.raises(ValueError, match="float16"):
        ScreenedGreedyHead(random_head() * 1e6)
    with pytest.raises(ValueError, match="% 8"):
        ScreenedGreedyHead(random_head(vocab=4092))


def test_only_plain_float32_heads_get_a_screen(tiny_model_paths):
    llama = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.float32)
    assert ScreenedGreedyHead.for_model(llama) is not None
    assert ScreenedGreedyHead.for_model(llama.to(torch.bfloat16)) is None
    llama.float()
    llama.config.model_type = "gemma2"  # soft-capped logits: not "hidden @ weight"
    assert ScreenedGreedyHead.for_model(llama) is None


def test_no_screen_when_its_copy_would_crowd_ram(tiny_model_paths, monkeypatch):
    from langchain_ascend import platform

    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.float32)
    copy_bytes = model.get_output_embeddings().weight.numel() * 2
    monkeypatch.setattr(platform, "memory_info", lambda device: platform.MemoryInfo(
        free=copy_bytes * 5, total=copy_bytes * 5, allocated=0))
    assert ScreenedGreedyHead.for_model(model) is None


def decode_batch(runner, prompt, params, steps):
    """Prefill ``prompt`` then ``steps`` decodes of request "r"; the generated ids."""
    table = list(range(runner.num_blocks))[: -(-(len(prompt) + steps + 1) // runner.block_size)]
    out = runner.execute(ScheduledBatch(segments=[ScheduledSegment("r", prompt, 0, table, True,
                                                                   params)]))
    tokens = [out[0]]
    for step in range(steps):
        seg = ScheduledSegment("r", [tokens[-1]], len(prompt) + step, table, True, params)
        tokens.append(runner.execute(ScheduledBatch(segments=[seg]))[0])
    runner.release(["r"])
    return tokens


def test_runner_screens_greedy_rows_only_and_matches_the_plain_head(tiny_model_paths,
                                                                    monkeypatch):
    runner = ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", num_blocks=16)
    assert isinstance(runner.logits_head, ScreenedGreedyHead)
    calls = []
    choose = ScreenedGreedyHead.choose
    monkeypatch.setattr(ScreenedGreedyHead, "choose",
                        lambda self, hidden: calls.append(1) or choose(self, hidden))
    prompt = list(range(40, 71))
    greedy = SamplingParams(max_tokens=20)
    screened = decode_batch(runner, prompt, greedy, 12)
    assert len(calls) == 13
    head, runner.logits_head = runner.logits_head, PlainLogitsHead()
    assert decode_batch(runner, prompt, greedy, 12) == screened  # the float32 head's tokens
    runner.logits_head = head
    calls.clear()
    decode_batch(runner, prompt, SamplingParams(max_tokens=20, temperature=0.8, seed=1), 3)
    assert not calls  # sampled rows need every logit
    monkeypatch.setattr(ScreenedGreedyHead, "choose", lambda self, hidden: None)
    assert decode_batch(runner, prompt, greedy, 12) == screened  # declined: full head, sampler


def test_kernels_missing_means_no_screen(tiny_model_paths, monkeypatch):
    monkeypatch.setattr(matvec, "matvec_tiles_f16", lambda *args: None)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.float32)
    assert ScreenedGreedyHead.for_model(model) is None
