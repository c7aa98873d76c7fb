"""Penalties and min-p in the sampler: transformers' repetition penalty and min-p, OpenAI's
presence / frequency penalties, batched beside rows without them, and their validation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
)

from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402
from langchain_ascend.engine.core.speculation import can_draft  # noqa: E402
from langchain_ascend.engine.worker.penalties import apply_penalties, penalize  # noqa: E402
from langchain_ascend.engine.worker.sampler import Sampler, filter_logits  # noqa: E402
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError  # noqa: E402

VOCAB = 40


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_repetition_penalty_equals_transformers_processor():
    logits = random_logits(1, seed=1)
    prompt, output = [3, 5, 7, 5], [9, 3, 11]
    got = penalize(logits, repetition=[1.3], presence=[0.0], frequency=[0.0],
                   context_ids=[prompt + output], output_ids=[output])
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]),
                                                 logits.clone())
    assert torch.equal(got, want)
    untouched = [t for t in range(VOCAB) if t not in prompt + output]
    assert torch.equal(got[0, untouched], logits[0, untouched])


def test_presence_and_frequency_penalties_count_reply_tokens_only():
    logits = torch.zeros(1, VOCAB)
    got = penalize(logits, repetition=[1.0], presence=[0.5], frequency=[0.25],
                   context_ids=[[1, 2, 2, 2]], output_ids=[[2, 2, 4]])
    assert got[0, 1] == 0.0  # prompt-only token: no OpenAI penalty
    assert got[0, 2] == pytest.approx(-(0.5 + 2 * 0.25))
    assert got[0, 4] == pytest.approx(-(0.5 + 0.25))
    negative = penalize(logits, repetition=[1.0], presence=[-1.0], frequency=[0.0],
                        context_ids=[[4]], output_ids=[[4]])
    assert negative[0, 4] == 1.0  # a negative penalty encourages the token


def test_only_penalized_rows_change_in_a_batch():
    logits = random_logits(3, seed=2)
    params = [SamplingParams(), SamplingParams(repetition_penalty=2.0),
              SamplingParams(frequency_penalty=1.0)]
    histories = [([1, 2], [3]), ([1, 2], [3]), ([1, 2], [3, 3])]
    edited = logits.clone()
    apply_penalties(edited, params, histories)
    assert torch.equal(edited[0], logits[0])
    assert not torch.equal(edited[1], logits[1])
    assert edited[2, 3] == pytest.approx(float(logits[2, 3]) - 2.0)
    assert torch.equal(edited[2, :3], logits[2, :3])


def test_penalized_rows_need_their_histories():
    with pytest.raises(ValueError, match="histories"):
        apply_penalties(random_logits(1), [SamplingParams(presence_penalty=1.0)], None)


def test_greedy_choice_sees_the_penalty():
    logits = torch.full((2, VOCAB), -1.0)
    logits[:, 7] = 2.0
    logits[:, 8] = 1.9
    params = [SamplingParams(repetition_penalty=1.2), SamplingParams()]
    out = Sampler(torch.device("cpu")).sample(logits, params, ["p", "q"],
                                              [([7], []), ([7], [])])
    assert out == [8, 7]  # 2.0 / 1.2 < 1.9 for the penalized row only


def test_min_p_keeps_what_transformers_keeps():
    logits = random_logits(2, seed=3)
    got = filter_logits(logits, [1.0, 1.0], [0, 0], [1.0, 1.0], [0.1, 0.0])
    want = MinPLogitsWarper(0.1)(torch.zeros(1, 1, dtype=torch.long), logits[:1].clone())
    assert torch.equal(torch.isfinite(got[0]), torch.isfinite(want[0]))
    assert bool(torch.isfinite(got[0]).sum() < VOCAB)
    assert bool(torch.isfinite(got[1]).all())  # min_p 0: every token stays


def test_min_p_restricts_the_sampled_support():
    probs = torch.tensor([0.5, 0.3, 0.12, 0.05, 0.03] + [0.0] * (VOCAB - 5))
    logits = probs.clamp_min(1e-12).log()[None]
    sampler = Sampler(torch.device("cpu"))
    seen = set()
    for i in range(200):
        seen.update(sampler.sample(logits, [SamplingParams(temperature=1.0, min_p=0.2, seed=i)],
                                   [f"r{i}"]))
    assert seen == {0, 1, 2}  # 0.12 >= 0.2 * 0.5; 0.05 is not


def test_penalties_turn_drafting_off():
    assert can_draft(SamplingParams(speculation="auto"))
    for penalty in ({"repetition_penalty": 1.1}, {"presence_penalty": 0.5},
                    {"frequency_penalty": -0.5}):
        params = SamplingParams(speculation="auto", **penalty)
        assert params.has_penalties and not can_draft(params)
    assert not SamplingParams(min_p=0.3).has_penalties


@pytest.mark.parametrize(("field", "value", "error"), [
    ("repetition_penalty", 0.0, InvalidRequestError),
    ("repetition_penalty", float("nan"), InvalidRequestError),
    ("repetition_penalty", True, InvalidArgumentTypeError),
    ("presence_penalty", 2.5, InvalidRequestError),
    ("frequency_penalty", -3, InvalidRequestError),
    ("frequency_penalty", "1", InvalidArgumentTypeError),
    ("min_p", 1.5, InvalidRequestError),
    ("min_p", None, InvalidArgumentTypeError),
])
def test_bad_values_raise_typed_errors_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        SamplingParams(**{field: value}).validate()
