"""Agent sessions through LLMEngine over the fake paged runner: a parked session's prefix
survives other sessions' pressure, background prefills land in it, outputs stay exact."""

from __future__ import annotations

import time

import pytest
from test_engine_host import FakeRunner, prompt_of, reference

from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.testing import build_tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tokenizer(4096))


@pytest.fixture
def make_engine(tokenizer):
    engines = []

    def factory(**kwargs):
        runner = FakeRunner(num_blocks=kwargs.pop("num_blocks", 24), block_size=4)
        engine = LLMEngine.from_runner(runner, tokenizer, eos_token_ids=[tokenizer.eos_token_id],
                                       max_num_batched_tokens=64, **kwargs)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.shutdown()


def run_hops(engine: LLMEngine, *, park: bool) -> tuple[list[list[int]], int]:
    """Session "a": hop 1, then other sessions fill the pool while "a"'s tools run, then hop
    2 over hop 1's context plus a tool result. Returns outputs and hop 2's cached tokens."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    hop1_prompt = prompt_of(1, 30)
    hop1 = engine.generate(hop1_prompt, params, session_id="a")
    if park:
        assert engine.park_session("a", ["search"]) is not None
    others = [engine.generate(prompt_of(10 + i, 40), params, session_id=f"o{i}")
              for i in range(3)]
    hop2_prompt = hop1_prompt + hop1.token_ids + prompt_of(99, 6)
    hop2 = engine.generate(hop2_prompt, params, session_id="a")
    assert hop2.token_ids == reference(hop2_prompt, 4)
    return [hop1.token_ids, hop2.token_ids] + [o.token_ids for o in others], \
        hop2.stats.num_cached_tokens


def test_parked_session_survives_pressure_and_output_is_unchanged(make_engine):
    lru_out, lru_cached = run_hops(make_engine(), park=False)
    engine = make_engine()
    kept_out, kept_cached = run_hops(engine, park=True)
    assert kept_out == lru_out
    assert lru_cached == 0                  # LRU: the other sessions evicted "a"
    assert kept_cached == 32                # 8 full blocks of hop 1's 34 computed tokens
    stats = engine.stats()
    assert stats.num_resumed == 1 and stats.num_resume_hits == 1
    assert stats.num_sessions_parked == 1 and stats.num_retained_sessions == 0
    assert stats.num_recomputed_tokens == 1  # hop 1's partial block: 2 of its 34 tokens...
    # ...minus the one never computed (the last sampled token) -> 33 shared, 32 hit.


def test_retention_off_parks_nothing(make_engine):
    engine = make_engine(session_retention=False)
    engine.generate(prompt_of(1, 10), SamplingParams(max_tokens=2), session_id="a")
    assert engine.park_session("a") is None
    assert engine.stats().num_retained_sessions == 0


def test_background_prefill_extends_the_parked_prefix(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompt = prompt_of(3, 12)
    hop1 = engine.generate(prompt, params, session_id="a")
    engine.park_session("a", ["search"], ttl_s=30.0)
    landed = prompt + hop1.token_ids + prompt_of(7, 9)       # a tool result that landed
    assert engine.prefill_session("a", landed)
    deadline = time.monotonic() + 5
    while engine.stats().num_background_tokens == 0 or engine.stats().num_running:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert engine.stats().num_retained_blocks == len(landed) // 4
    final = landed + prompt_of(8, 5)
    hop2 = engine.generate(final, params, session_id="a")
    assert hop2.token_ids == reference(final, 4)
    assert hop2.stats.num_cached_tokens == (len(landed) // 4) * 4
    assert engine.stats().num_background_tokens > 0


def test_prefill_needs_a_parked_session_and_session_ids_are_checked(make_engine):
    engine = make_engine()
    assert not engine.prefill_session("nobody", [1, 2, 3])
    with pytest.raises(InvalidRequestError):
        engine.generate([1, 2], SamplingParams(max_tokens=1), session_id="")


def test_agent_scheduling_gives_same_outputs(make_engine):
    fcfs, _ = run_hops(make_engine(), park=True)
    agent, _ = run_hops(make_engine(scheduling="agent"), park=True)
    assert fcfs == agent
    with pytest.raises(InvalidRequestError):
        make_engine(scheduling="lifo")


@pytest.mark.parametrize("scheduling", ["fcfs", "agent"])
def test_many_parked_sessions_in_a_small_pool_all_complete(make_engine, scheduling):
    """32 agents of 3 hops, each parking and prefilling in the background, in a pool that
    holds a few of them: no stall, every output exact, the cap held, nothing leaked."""
    import threading

    engine = make_engine(num_blocks=40, scheduling=scheduling, retention_cap=0.25)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    failures: list[BaseException] = []
    peaks: list[int] = []

    def agent(index: int) -> None:
        try:
            context = prompt_of(1000 + index, 12)
            for hop in range(3):
                out = engine.generate(context, params, session_id=f"s{index}")
                assert out.token_ids == reference(context, 3)
                engine.park_session(f"s{index}", ["t"], ttl_s=5.0)
                context = context + out.token_ids + prompt_of(index * 7 + hop, 5)
                engine.prefill_session(f"s{index}", context)
                peaks.append(engine.stats().num_retained_blocks)
            engine.release_session(f"s{index}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "an agent stalled"
    assert not failures, failures[0]
    deadline = time.monotonic() + 5
    while engine.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = engine.stats()
    assert max(peaks) <= stats.retention_cap_blocks == 10
    assert stats.num_blocks_used == 0 and stats.num_running == 0
