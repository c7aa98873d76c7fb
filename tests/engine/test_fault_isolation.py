"""One request's fault stays its own: a constraint (logits processing / grammar callback) that
raises inside a model step fails that request alone; the other requests of the step keep
exactly the tokens of their solo runs, every block comes back, and the engine keeps serving.

Both driver modes (the loop thread, and a CPU caller driving its own steps) over a fake runner
that runs the REAL sampler on logits built from the fake model's next token, and once over the
tiny real model.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

torch = pytest.importorskip("torch")

from test_engine_host import (  # noqa: E402  (tests/engine is on sys.path)
    DRIVERS,
    VOCAB,
    FakeDevice,
    FakeRunner,
    prompt_of,
    reference,
)

from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402
from langchain_ascend.engine.llm_engine import LLMEngine  # noqa: E402
from langchain_ascend.engine.worker.sampler import Sampler  # noqa: E402
from langchain_ascend.errors import (  # noqa: E402
    EngineStepError,
    InvalidRequestError,
    RequestFaultError,
)
from langchain_ascend.testing import build_tokenizer, load_tokenizer  # noqa: E402


class SamplingFakeRunner(FakeRunner):
    """The fake model's next token becomes a logits row; the real :class:`Sampler` (with its
    constraint calls) picks the token. Records the request ids of every step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sampler = Sampler(torch.device("cpu"))
        self.steps: list[list[str]] = []

    def execute(self, batch):
        self.steps.append([seg.request_id for seg in batch.segments])
        targets = super().execute(batch)
        rows = [i for i, seg in enumerate(batch.segments) if seg.sample]
        if not rows:
            return targets
        logits = torch.zeros(len(rows), VOCAB)  # (S, V)
        for r, i in enumerate(rows):
            logits[r, targets[i]] = 10.0
        with torch.inference_mode():
            tokens = self.sampler.sample(logits, [batch.segments[i].sampling for i in rows],
                                         [batch.segments[i].request_id for i in rows])
        for r, i in enumerate(rows):
            targets[i] = tokens[r]
        return targets

    def release(self, request_ids):
        super().release(request_ids)
        self.sampler.release(request_ids)


class Exploding:
    """A constraint allowing every token whose ``where`` callback raises on call ``after``."""

    def __init__(self, where: str, after: int = 3) -> None:
        self.where = where
        self.after = after
        self.calls = 0

    def _maybe_fail(self, name: str) -> None:
        if name == self.where:
            self.calls += 1
            if self.calls >= self.after:
                raise ValueError(f"grammar exploded in {name}")

    def mask_logits(self, logits):
        self._maybe_fail("mask_logits")

    def accept_token(self, token_id):
        self._maybe_fail("accept_token")

    def is_terminated(self):
        self._maybe_fail("is_terminated")
        return False


class AllowAll:
    """A well-behaved constraint that allows everything (the good requests carry one too, so
    a fault is told apart from its constrained neighbours)."""

    def mask_logits(self, logits):
        pass

    def accept_token(self, token_id):
        pass

    def is_terminated(self):
        return False


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tokenizer(VOCAB))


@pytest.fixture(params=list(DRIVERS))
def make_engine(tokenizer, request):
    engines = []

    def factory(runner, **kwargs):
        runner.device = FakeDevice(DRIVERS[request.param])
        engine = LLMEngine.from_runner(runner, tokenizer,
                                       eos_token_ids=[tokenizer.eos_token_id], **kwargs)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.shutdown()


GOOD = [(prompt_of(10 + i, 5 + i), 6 + i % 3) for i in range(7)]


def run_concurrently(engine, jobs):
    """``jobs``: (prompt, params) pairs; returns each one's RequestOutput or exception."""
    results: dict[int, object] = {}
    barrier = threading.Barrier(len(jobs))

    def call(i, prompt, params):
        barrier.wait()
        try:
            results[i] = engine.generate(prompt, params)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.mark.parametrize("where", ["mask_logits", "accept_token", "is_terminated"])
def test_one_failing_constraint_fails_only_its_request(make_engine, where):
    runner = SamplingFakeRunner(num_blocks=64, step_delay=0.002)
    engine = make_engine(runner)
    free_at_start = engine.stats().num_blocks_free
    solo = [reference(p, n) for p, n in GOOD]
    jobs = [(p, SamplingParams(max_tokens=n, ignore_eos=True, constraint=AllowAll()))
            for p, n in GOOD]
    bad = Exploding(where)
    jobs.insert(3, (prompt_of(99, 6), SamplingParams(max_tokens=20, ignore_eos=True,
                                                     constraint=bad)))
    results = run_concurrently(engine, jobs)

    error = results.pop(3)
    assert isinstance(error, RequestFaultError) and isinstance(error, EngineStepError)
    assert f"{where}()" in str(error) and "grammar exploded" in str(error)
    assert isinstance(error.__cause__, ValueError)
    outs = [results[i] for i in sorted(results)]
    assert [o.token_ids for o in outs] == solo  # type: ignore[attr-defined]
    # the fault happened in a step shared with good requests
    bad_id = next(rid for step in runner.steps for rid in step
                  if all(rid != getattr(o, "request_id", None) for o in outs))
    assert max(len(s) for s in runner.steps if bad_id in s) > 1
    stats = engine.stats()
    assert stats.num_blocks_free == free_at_start and stats.num_blocks_used == 0
    assert stats.num_running == stats.num_waiting == 0
    # the engine serves new requests, the same solo tokens again
    again = engine.generate(GOOD[0][0], SamplingParams(max_tokens=GOOD[0][1], ignore_eos=True))
    assert again.token_ids == solo[0]
    assert engine.stats().num_blocks_free == free_at_start


async def test_a_failing_constraint_in_astream_and_agenerate(make_engine):
    runner = SamplingFakeRunner(num_blocks=64, step_delay=0.002)
    engine = make_engine(runner)
    free_at_start = engine.stats().num_blocks_free

    async def bad_stream():
        params = SamplingParams(max_tokens=20, ignore_eos=True,
                                constraint=Exploding("mask_logits", after=2))
        return [d async for d in engine.astream(prompt_of(77, 6), params)]

    coros = [engine.agenerate(p, SamplingParams(max_tokens=n, ignore_eos=True))
             for p, n in GOOD]
    outs = await asyncio.gather(bad_stream(), *coros, return_exceptions=True)
    assert isinstance(outs[0], RequestFaultError)
    assert [o.token_ids for o in outs[1:]] == [reference(p, n) for p, n in GOOD]
    assert engine.stats().num_blocks_free == free_at_start


def test_a_step_failure_no_request_owns_still_fails_the_step(make_engine):
    """Unattributable (the forward itself): every request of the step gets EngineStepError
    (not RequestFaultError), and the engine keeps serving."""
    runner = SamplingFakeRunner(num_blocks=64)
    engine = make_engine(runner)
    runner.fail_when = lambda batch: True
    with pytest.raises(EngineStepError) as info:
        engine.generate(prompt_of(1, 5), SamplingParams(max_tokens=3))
    assert not isinstance(info.value, RequestFaultError)
    runner.fail_when = None
    assert engine.generate(prompt_of(1, 5), SamplingParams(max_tokens=3)).token_ids == \
        reference(prompt_of(1, 5), 3)


def test_the_callers_params_keep_their_own_constraint(make_engine):
    runner = SamplingFakeRunner(num_blocks=64)
    engine = make_engine(runner)
    constraint = AllowAll()
    params = SamplingParams(max_tokens=2, constraint=constraint)
    engine.generate(prompt_of(2, 5), params)
    assert params.constraint is constraint


@pytest.mark.parametrize(("params", "needle"), [
    (SamplingParams(temperature=float("nan")), "temperature"),
    (SamplingParams(temperature=float("inf")), "temperature"),
    (SamplingParams(seed=2**64), "seed"),
    (SamplingParams(seed=-1), "seed"),
    (SamplingParams(top_k=2.7), "top_k"),  # type: ignore[arg-type]
    (SamplingParams(max_tokens=True), "max_tokens"),
])
def test_values_that_used_to_fail_inside_the_step_are_refused_up_front(make_engine, params,
                                                                       needle):
    runner = SamplingFakeRunner(num_blocks=64, step_delay=0.002)
    engine = make_engine(runner)
    with pytest.raises(InvalidRequestError, match=needle):
        engine.generate(prompt_of(3, 5), params)
    assert runner.steps == []  # nothing ran
    out = engine.generate(prompt_of(3, 5), SamplingParams(max_tokens=3))
    assert out.token_ids == reference(prompt_of(3, 5), 3)


def test_real_model_seven_good_one_faulty(tiny_qwen2_path):
    """The tiny real model on CPU: the good requests' greedy tokens equal their solo runs."""
    engine = LLMEngine(tiny_qwen2_path, device="cpu", dtype="float32", block_size=4,
                       num_blocks=128, max_num_batched_tokens=256)
    try:
        free_at_start = engine.stats().num_blocks_free
        prompts = [engine.tokenizer.encode(f"Request {i}: tell me about item {i * 7}.")
                   for i in range(7)]
        solo = [engine.generate(p, SamplingParams(max_tokens=5, ignore_eos=True)).token_ids
                for p in prompts]
        jobs = [(p, SamplingParams(max_tokens=5, ignore_eos=True)) for p in prompts]
        jobs.append((prompts[0], SamplingParams(max_tokens=5, ignore_eos=True,
                                                constraint=Exploding("mask_logits", 2))))
        results = run_concurrently(engine, jobs)
        assert isinstance(results.pop(7), RequestFaultError)
        assert [results[i].token_ids for i in range(7)] == solo  # type: ignore[attr-defined]
        assert engine.stats().num_blocks_free == free_at_start
        assert engine.generate(prompts[1], SamplingParams(max_tokens=5, ignore_eos=True)
                               ).token_ids == solo[1]
    finally:
        engine.shutdown()
