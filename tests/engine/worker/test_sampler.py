"""Sampler: greedy, temperature/top-k/top-p support, per-request seeds, constraint hooks."""

from __future__ import annotations

import pytest
import torch

from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.speculation import accept_drafts
from langchain_ascend.engine.worker.sampler import Sampler, filter_logits, greedy_ids

VOCAB = 50


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.fixture
def sampler():
    return Sampler(torch.device("cpu"))


def test_greedy_is_argmax(sampler):
    logits = random_logits(6)
    ids = [f"r{i}" for i in range(6)]
    out = sampler.sample(logits, [SamplingParams()] * 6, ids)
    assert out == logits.argmax(-1).tolist()
    assert sampler.req_to_generator == {}  # greedy rows need no generator


def test_greedy_ids_break_ties_and_nans_as_torch_argmax():
    nan = float("nan")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [nan, 1.0, nan, 2.0], [-1.0, -1.0, -1.0, -1.0],
                           [0.0, 2.0, nan, 5.0], [-float("inf"), -float("inf"), 0.0, 0.0]])
    assert greedy_ids(logits) == logits.argmax(-1).tolist() == [1, 0, 0, 2, 2]
    wide = random_logits(3)
    assert greedy_ids(wide.bfloat16()) == wide.bfloat16().argmax(-1).tolist()  # torch's path
    assert greedy_ids(wide) == wide.argmax(-1).tolist()


def test_bfloat16_logits_are_sampled_in_float32(sampler):
    logits = random_logits(3)
    out = sampler.sample(logits.bfloat16(), [SamplingParams()] * 3, ["a", "b", "c"])
    assert out == logits.bfloat16().float().argmax(-1).tolist()


def test_top_k_one_equals_greedy(sampler):
    logits = random_logits(4, seed=1)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=i) for i in range(4)]
    assert sampler.sample(logits, params, list("abcd")) == logits.argmax(-1).tolist()


def test_seed_reproducible_whatever_the_batch_neighbours():
    target = random_logits(1, seed=2)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=77)

    def draw(neighbours: int, steps: int = 5) -> list[int]:
        sampler = Sampler(torch.device("cpu"))
        out = []
        for step in range(steps):
            others = random_logits(neighbours, seed=100 + step)
            logits = torch.cat([others[: neighbours // 2], target[None], others[neighbours // 2:]])
            plist = [SamplingParams(temperature=0.7, seed=None)] * neighbours
            plist.insert(neighbours // 2, params)
            rids = [f"n{i}" for i in range(neighbours)]
            rids.insert(neighbours // 2, "me")
            out.append(sampler.sample(logits, plist, rids)[neighbours // 2])
        return out

    alone = draw(0)
    assert draw(3) == alone
    assert draw(8) == alone
    other_seed = Sampler(torch.device("cpu"))
    draws = [other_seed.sample(target[None], [SamplingParams(temperature=1.0, seed=s)], [f"x{s}"])[0]
             for s in range(20)]
    assert len(set(draws)) > 1  # the seed matters


def test_unseeded_requests_get_their_own_generators(sampler):
    logits = random_logits(2, seed=3)
    params = [SamplingParams(temperature=1.0)] * 2
    sampler.sample(logits, params, ["a", "b"])
    gens = sampler.req_to_generator
    assert set(gens) == {"a", "b"} and gens["a"] is not gens["b"]
    sampler.release(["a", "zzz"])
    assert set(sampler.req_to_generator) == {"b"}


def test_top_p_restricts_support(sampler):
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04] + [0.0] * (VOCAB - 5))
    logits = probs.clamp_min(1e-12).log()[None]  # (1, V)
    seen = set()
    for i in range(300):
        seen.update(sampler.sample(logits, [SamplingParams(temperature=1.0, top_p=0.75, seed=i)],
                                   [f"r{i}"]))
    assert seen == {0, 1}  # 0.5 + 0.3 reaches 0.75; token 2 is outside the nucleus


def test_top_k_restricts_support(sampler):
    logits = random_logits(1, seed=4)
    top3 = set(logits[0].topk(3).indices.tolist())
    seen = set()
    for i in range(300):
        seen.update(sampler.sample(logits, [SamplingParams(temperature=5.0, top_k=3, seed=i)],
                                   [f"r{i}"]))
    assert seen == top3


def test_filter_logits_pure_function():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    out = filter_logits(logits, [2.0, 1.0], [2, 0], [1.0, 0.7])  # row 2: 0.64 + 0.24
    assert torch.equal(torch.isfinite(out), torch.tensor([[True, True, False, False],
                                                          [False, False, True, True]]))
    assert out[0, 0] == 2.0  # temperature applied before filtering
    unfiltered = filter_logits(logits, [1.0, 1.0], [0, 0], [1.0, 1.0])
    assert torch.equal(unfiltered, logits)


class RecordingConstraint:
    """Allows only ``allowed`` tokens; records the calls the sampler makes."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed
        self.calls: list[tuple[str, object]] = []

    def mask_logits(self, logits: torch.Tensor) -> None:
        assert logits.shape == (VOCAB,)
        self.calls.append(("mask", None))
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[list(self.allowed)] = True
        logits.masked_fill_(~keep, float("-inf"))

    def accept_token(self, token_id: int) -> None:
        self.calls.append(("accept", token_id))

    def is_terminated(self) -> bool:
        return False


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constraint_masks_before_and_accepts_after(sampler, temperature):
    logits = random_logits(2, seed=5)
    worst = int(logits[0].argmin())
    constraint = RecordingConstraint({worst})
    params = [SamplingParams(temperature=temperature, seed=1, constraint=constraint),
              SamplingParams(temperature=temperature, seed=2)]
    out = sampler.sample(logits.clone(), params, ["c", "free"])
    assert out[0] == worst
    assert constraint.calls == [("mask", None), ("accept", worst)]
    if temperature == 0.0:
        assert out[1] == int(logits[1].argmax())


class ParityGrammar:
    """Allows only even tokens after an even one and odd after an odd one (the first free);
    ends after ``length`` tokens. Records the tokens it accepted."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.accepted: list[int] = []

    def mask_logits(self, logits: torch.Tensor) -> None:
        if self.accepted:
            parity = self.accepted[-1] % 2
            logits[torch.arange(VOCAB) % 2 != parity] = float("-inf")

    def accept_token(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_terminated(self) -> bool:
        return len(self.accepted) >= self.length


def sequential_greedy(logits: torch.Tensor, grammar: ParityGrammar) -> list[int]:
    """What one pass per token would choose: row ``i`` masked after rows ``< i``."""
    out = []
    for row in logits.clone():
        grammar.mask_logits(row)
        out.append(int(row.argmax()))
        grammar.accept_token(out[-1])
    return out


def test_a_constrained_verify_masks_each_row_after_the_drafts_before_it(sampler):
    logits = random_logits(5, seed=11)  # the pending token's row and 4 drafts' rows
    targets = sequential_greedy(logits, ParityGrammar(10))
    grammar = ParityGrammar(10)
    # every draft right: all 5 rows chosen as one pass per token would, each masked in turn
    out = sampler.sample(logits.clone(), [SamplingParams(constraint=grammar)] * 5, ["a"] * 5,
                         verify=[(0, targets[:4])])
    assert out == targets and grammar.accepted == targets
    # the second draft wrong: the rows after it are not chosen and the grammar holds only
    # the accepted draft and the model's token
    wrong = targets[1] + 2 if targets[1] + 2 < VOCAB else targets[1] - 2
    grammar = ParityGrammar(10)
    out = sampler.sample(logits.clone(), [SamplingParams(constraint=grammar)] * 5, ["a"] * 5,
                         verify=[(0, [targets[0], wrong, *targets[2:4]])])
    assert out == targets[:2] + [-1, -1, -1]
    assert accept_drafts([targets[0], wrong, *targets[2:4]], out) == targets[:2]
    assert grammar.accepted == targets[:2]


def test_a_constrained_verify_stops_where_the_grammar_ends(sampler):
    logits = random_logits(4, seed=12)
    targets = sequential_greedy(logits, ParityGrammar(10))
    grammar = ParityGrammar(2)
    out = sampler.sample(logits.clone(), [SamplingParams(constraint=grammar)] * 4, ["a"] * 4,
                         verify=[(0, targets[:3])])
    assert out == targets[:2] + [-1, -1] and grammar.accepted == targets[:2]


def test_a_constrained_verify_beside_plain_rows(sampler):
    logits = random_logits(4, seed=13)
    targets = sequential_greedy(logits[1:3], ParityGrammar(10))
    grammar = RecordingConstraint({7})
    params = [SamplingParams(constraint=grammar)] + [
        SamplingParams(constraint=(verified := ParityGrammar(10)))] * 2 + [SamplingParams()]
    out = sampler.sample(logits.clone(), params, ["c", "v", "v", "free"],
                         verify=[(1, targets[:1])])
    assert out == [7, *targets, int(logits[3].argmax())]
    assert grammar.calls == [("mask", None), ("accept", 7)]  # masked once, not per row
    assert verified.accepted == targets


def test_uniform_noise_stays_strictly_inside_zero_one_even_at_the_extremes():
    # The top and bottom hash values must not round to 1.0 or 0.0 in float32: an Exp(1) draw
    # of 0 would turn a masked token's 0 / 0 into NaN, which wins the argmax race.
    import torch

    from langchain_ascend.engine.worker import sampler

    noise = sampler.uniform_noise(torch.arange(64, dtype=torch.long) * 7919, 1 << 16)
    assert bool((noise > 0).all()) and bool((noise < 1).all())
    top = (torch.tensor([(1 << 23) - 1, 0]).float() + 0.5) * (1.0 / (1 << 23))
    assert top[0].item() < 1.0 and top[1].item() > 0.0


def test_a_row_with_one_allowed_token_always_samples_it():
    import torch

    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.worker.sampler import Sampler

    class OnlyOne:
        def __init__(self, token: int) -> None:
            self.token = token

        def mask_logits(self, row: torch.Tensor) -> None:
            keep = row[self.token].clone()
            row.fill_(float("-inf"))
            row[self.token] = keep

        def accept_token(self, token_id: int) -> None:
            assert token_id == self.token

        def is_terminated(self) -> bool:
            return False

    sampler = Sampler(torch.device("cpu"))
    vocab = 4096
    for seed in range(200):
        params = SamplingParams(max_tokens=1, temperature=1.0, seed=seed)
        params.constraint = OnlyOne(seed % vocab)
        logits = torch.randn(1, vocab)
        assert sampler.sample(logits, [params], [f"r{seed}"]) == [seed % vocab]
