"""Worker threads and retry policy behind NPUStreamToolExecutor: hung calls are abandoned and
bounded, threads are reused and retire, a hung tool never blocks interpreter exit."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
import time
from textwrap import dedent

import pytest
from langchain_core.tools import tool
from tool_test_helpers import tool_call

from langchain_ascend import NPUStreamToolExecutor
from langchain_ascend.errors import ToolCallError, ToolTimeoutError, ToolWorkersExhaustedError
from langchain_ascend.executor.runtime import RetryPolicy
from langchain_ascend.executor.workers import WorkerPool


def _wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_abandoned_threads_are_bounded_then_come_back(release: threading.Event) -> None:
    @tool
    def hang(x: int) -> str:
        """Blocks until released."""
        release.wait(10)
        return "late"

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    executor = NPUStreamToolExecutor([hang, add], timeout_ms=100, max_abandoned_threads=2)
    out = executor.invoke([tool_call("hang", "h1", x=1), tool_call("hang", "h2", x=2)])
    assert [m.status for m in out] == ["error", "error"]
    assert executor.thread_stats().abandoned == 2

    (refused,) = executor.invoke([tool_call("add", "a", a=1, b=1)])
    assert refused.status == "error" and "still stuck" in refused.content

    release.set()
    assert _wait_for(lambda: executor.thread_stats().abandoned == 0)
    (ok,) = executor.invoke([tool_call("add", "a", a=1, b=1)])
    assert ok.content == "2"
    assert executor.thread_stats().threads == 2  # the returned threads were reused


def test_threads_are_reused_between_invocations() -> None:
    @tool
    def nap(i: int) -> int:
        """Short sleep."""
        time.sleep(0.02)
        return i

    executor = NPUStreamToolExecutor([nap])
    calls = [tool_call("nap", f"c{i}", i=i) for i in range(4)]
    executor.invoke(calls)
    first = executor.thread_stats().threads
    executor.invoke(calls)
    assert first == 4 and executor.thread_stats().threads == 4


def test_idle_threads_retire() -> None:
    pool = WorkerPool(idle_s=0.05)
    done = threading.Event()
    pool.submit(done.set, contextvars.copy_context())
    assert done.wait(2)
    assert _wait_for(lambda: pool.stats().threads == 0, timeout=2)


def test_pool_refuses_when_too_many_are_stuck() -> None:
    pool = WorkerPool(max_abandoned=1)
    gate = threading.Event()
    job = pool.submit(lambda: gate.wait(5), contextvars.copy_context())
    pool.abandon(job)
    with pytest.raises(ToolWorkersExhaustedError, match="max_abandoned_threads=1"):
        pool.submit(lambda: None, contextvars.copy_context())
    gate.set()
    assert _wait_for(lambda: pool.stats().abandoned == 0)
    finished = threading.Event()
    pool.submit(finished.set, contextvars.copy_context())
    assert finished.wait(2)


def test_a_hung_tool_does_not_block_interpreter_exit() -> None:
    script = dedent("""
        import time
        from langchain_core.tools import tool
        from langchain_ascend import NPUStreamToolExecutor

        @tool
        def hang(x: int) -> str:
            \"\"\"Never returns in time.\"\"\"
            time.sleep(120)
            return "late"

        out = NPUStreamToolExecutor([hang], timeout_ms=100, device=None).invoke(
            [{"name": "hang", "args": {"x": 1}, "id": "h"}])
        print(out[0].status)
    """)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "error"
    assert time.monotonic() - start < 60


def test_retry_policy() -> None:
    policy = RetryPolicy(times=2, retry_on=(ConnectionError,), on_timeout=False,
                         never=(ToolCallError,), backoff_s=0.1, max_backoff_s=0.3)
    assert policy.should_retry(ConnectionResetError(), 1)
    assert policy.should_retry(ConnectionError(), 2)
    assert not policy.should_retry(ConnectionError(), 3)
    assert not policy.should_retry(ValueError(), 1)
    assert not policy.should_retry(ToolTimeoutError("t"), 1)
    for attempts, (low, high) in {1: (0.05, 0.1), 2: (0.1, 0.2), 5: (0.15, 0.3)}.items():
        delays = [policy.delay_s(attempts) for _ in range(50)]
        assert all(low <= d <= high for d in delays)
    everything = RetryPolicy(times=1, retry_on=(Exception,), on_timeout=True,
                             never=(ToolCallError,), backoff_s=0)
    assert not everything.should_retry(ToolCallError("bad args"), 1)
    assert everything.should_retry(ToolTimeoutError("t"), 1)


def test_the_abandoned_bound_holds_when_every_call_hangs(release: threading.Event) -> None:
    """Five hung calls, bound 2: never more than 2 stuck threads; the calls beyond the bound
    wait for a slot, then fail fast once both slots are stuck; an async tool still runs."""
    @tool
    def hang(x: int) -> str:
        """Blocks until released."""
        release.wait(10)
        return "late"

    @tool
    async def aping(x: int) -> int:
        """Async echo."""
        return x

    executor = NPUStreamToolExecutor([hang, aping], timeout_ms=100, max_abandoned_threads=2)
    out = executor.invoke([tool_call("hang", f"h{i}", x=i) for i in range(5)])
    assert [m.status for m in out] == ["error"] * 5
    assert sum("timed out after 100 ms" in m.content for m in out) == 2
    assert sum("still stuck" in m.content for m in out) == 3
    stats = executor.thread_stats()
    assert stats.abandoned == 2 and stats.threads == 2

    import asyncio

    (served,) = asyncio.run(executor.ainvoke([tool_call("aping", "a", x=7)]))
    assert served.content == "7"
    (refused,) = executor.invoke([tool_call("hang", "h9", x=9)])
    assert "max_abandoned_threads=2" in refused.content
    assert executor.thread_stats().abandoned == 2
    release.set()
    assert _wait_for(lambda: executor.thread_stats().abandoned == 0)


def test_pool_slots_wait_for_live_attempts() -> None:
    from langchain_ascend.executor.workers import PoolFull

    pool = WorkerPool(max_abandoned=1)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(5), contextvars.copy_context())
    with pytest.raises(PoolFull):  # busy with a live attempt: wait, do not fail the call
        pool.submit(lambda: None, contextvars.copy_context())
    gate.set()
    assert _wait_for(lambda: pool.stats().idle == 1)
    done = threading.Event()
    pool.submit(done.set, contextvars.copy_context())
    assert done.wait(2)


def test_max_abandoned_threads_must_be_positive() -> None:
    from langchain_ascend.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="max_abandoned_threads"):
        NPUStreamToolExecutor([], max_abandoned_threads=0)
