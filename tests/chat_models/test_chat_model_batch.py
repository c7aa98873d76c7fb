"""``batch`` lets every input reach the engine at once (LangChain's default pool runs six)."""

from __future__ import annotations

import threading

import pytest

from langchain_ascend.chat.batching import MAX_BATCH_THREADS, batch_configs

NUM_INPUTS = 12  # more than LangChain's default pool of min(32, cores + 4) on <= 7 cores


def test_batch_configs_run_all_inputs_at_once_unless_the_caller_limits():
    assert [c["max_concurrency"] for c in batch_configs(None, 5)] == [5] * 5
    assert batch_configs({"max_concurrency": 2}, 3)[0]["max_concurrency"] == 2
    assert batch_configs(None, 10_000)[0]["max_concurrency"] == MAX_BATCH_THREADS
    tagged = batch_configs({"tags": ["x"]}, 2)
    assert tagged[0]["tags"] == ["x"] and tagged[0]["max_concurrency"] == 2


def _gated_engine(monkeypatch, engine, parties, timeout=20.0):
    """Every generate call waits until ``parties`` calls are inside it at once."""
    barrier = threading.Barrier(parties, timeout=timeout)
    real = engine.generate

    def generate(*args, **kwargs):
        barrier.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", generate)


def test_batch_sends_every_input_to_the_engine_together(tiny_chat, monkeypatch):
    engine = tiny_chat._engine_for()
    _gated_engine(monkeypatch, engine, NUM_INPUTS)
    replies = tiny_chat.batch([f"question {i}" for i in range(NUM_INPUTS)], max_tokens=4)
    assert len(replies) == NUM_INPUTS
    assert all(r.usage_metadata["output_tokens"] >= 1 for r in replies)


def test_batch_honours_the_callers_max_concurrency(tiny_chat, monkeypatch):
    engine = tiny_chat._engine_for()
    _gated_engine(monkeypatch, engine, 3, timeout=1.0)
    with pytest.raises(threading.BrokenBarrierError):
        tiny_chat.batch([f"q {i}" for i in range(3)], config={"max_concurrency": 2},
                        max_tokens=4)
