"""NPUStreamToolExecutor.ainvoke: the same guarantees on the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool
from tool_test_helpers import Gate, ai, tool_call

from langchain_ascend import NPUStreamToolExecutor
from langchain_ascend.errors import ToolTimeoutError


@tool
async def asleep(seconds: float, tag: str) -> str:
    """Async sleep, then echo the tag."""
    await asyncio.sleep(seconds)
    return f"done {tag}"


@tool
def sleep_sync(seconds: float, tag: str) -> str:
    """Blocking sleep, then echo the tag."""
    time.sleep(seconds)
    return f"done {tag}"


async def test_order_and_concurrency_with_async_and_sync_tools() -> None:
    executor = NPUStreamToolExecutor([asleep, sleep_sync])
    delays = [0.12, 0.0, 0.06, 0.03]
    calls = [tool_call("asleep" if i % 2 else "sleep_sync", f"c{i}", seconds=d, tag=str(i))
             for i, d in enumerate(delays)]
    start = time.perf_counter()
    out = await executor.ainvoke({"messages": [ai(*calls)]})
    elapsed = time.perf_counter() - start
    messages = out["messages"]
    assert [m.tool_call_id for m in messages] == ["c0", "c1", "c2", "c3"]
    assert [m.content for m in messages] == ["done 0", "done 1", "done 2", "done 3"]
    assert [m.response_metadata["tool_timing"]["mode"] for m in messages] == [
        "thread", "async", "thread", "async"]
    assert elapsed < sum(delays)


async def test_sync_tools_only_use_the_thread_lanes() -> None:
    out = await NPUStreamToolExecutor([sleep_sync]).ainvoke(
        [tool_call("sleep_sync", f"s{i}", seconds=0.05, tag=str(i)) for i in range(6)])
    assert [m.content for m in out] == [f"done {i}" for i in range(6)]
    starts = [m.response_metadata["tool_timing"]["start_ms"] for m in out]
    ends = [m.response_metadata["tool_timing"]["end_ms"] for m in out]
    assert max(starts) < min(ends)  # all six overlapped


@pytest.mark.parametrize("limit", [1, 2])
async def test_max_concurrency_async_tools(limit: int) -> None:
    gate = Gate(target=limit)

    @tool
    async def gated(i: int) -> int:
        """Counts concurrent callers."""
        await gate.apass_through()
        return i

    executor = NPUStreamToolExecutor([gated], max_concurrency=limit)
    out = await executor.ainvoke([tool_call("gated", f"c{i}", i=i) for i in range(3 * limit)])
    assert [m.content for m in out] == [str(i) for i in range(3 * limit)]
    assert gate.peak == limit


async def test_max_concurrency_sync_tools_and_config_limit() -> None:
    gate = Gate(target=2)

    @tool
    def gated(i: int) -> int:
        """Counts concurrent callers."""
        gate.pass_through()
        return i

    executor = NPUStreamToolExecutor([gated])
    await executor.ainvoke([tool_call("gated", f"c{i}", i=i) for i in range(6)],
                           config={"max_concurrency": 2})
    assert gate.peak == 2


async def test_mixed_tools_share_one_bound() -> None:
    gate = Gate(target=2)

    @tool
    async def agated(i: int) -> int:
        """Async, counted."""
        await gate.apass_through()
        return i

    @tool
    def sgated(i: int) -> int:
        """Sync, counted."""
        gate.pass_through()
        return i

    calls = [tool_call("agated" if i % 2 else "sgated", f"c{i}", i=i) for i in range(6)]
    out = await NPUStreamToolExecutor([agated, sgated], max_concurrency=2).ainvoke(calls)
    assert [m.content for m in out] == [str(i) for i in range(6)]
    assert gate.peak == 2


async def test_timeout_of_an_async_tool_that_ignores_cancellation() -> None:
    @tool
    async def stubborn(x: int) -> str:
        """Swallows the first cancellation."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.6)
        return "late"

    executor = NPUStreamToolExecutor([stubborn, asleep], timeout_ms=200)
    start = time.perf_counter()
    out = await executor.ainvoke([tool_call("stubborn", "s", x=1),
                                  tool_call("asleep", "a", seconds=0.01, tag="ok")])
    assert time.perf_counter() - start < 0.5
    assert [m.status for m in out] == ["error", "success"]
    assert "timed out after 200 ms" in out[0].content
    await asyncio.sleep(0.7)  # let the stubborn task finish before the loop closes


async def test_timeout_of_a_sync_tool_in_async_mode(release: threading.Event) -> None:
    @tool
    def hang(x: int) -> str:
        """Blocks."""
        release.wait(10)
        return "late"

    executor = NPUStreamToolExecutor([hang, sleep_sync], timeout_ms=200)
    start = time.perf_counter()
    out = await executor.ainvoke([tool_call("hang", "h", x=1),
                                  tool_call("sleep_sync", "s", seconds=0.01, tag="ok")])
    assert time.perf_counter() - start < 1.0
    assert [m.status for m in out] == ["error", "success"]
    strict = NPUStreamToolExecutor([hang], timeout_ms=100, handle_tool_errors=False)
    with pytest.raises(ToolTimeoutError):
        await strict.ainvoke([tool_call("hang", "h", x=1)])


async def test_retry_async() -> None:
    attempts = {"n": 0}

    @tool
    async def flaky(x: int) -> str:
        """Fails twice."""
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise ConnectionError("reset")
        return "ok"

    (message,) = await NPUStreamToolExecutor([flaky], retry_backoff_ms=1).ainvoke(
        [tool_call("flaky", "f", x=1)])
    assert message.content == "ok" and message.response_metadata["tool_timing"]["retries"] == 2


async def test_errors_async() -> None:
    @tool
    async def aboom(x: int) -> str:
        """Fails."""
        raise ValueError("async kaput")

    executor = NPUStreamToolExecutor([aboom])
    out = await executor.ainvoke([tool_call("aboom", "1", x=1), tool_call("aboom", "2", x="bad"),
                                  tool_call("nope", "3")])
    assert out[0].content == "Error: tool 'aboom' raised ValueError: async kaput"
    assert "invalid arguments for tool 'aboom'" in out[1].content
    assert "no tool named 'nope'" in out[2].content
    with pytest.raises(ValueError, match="async kaput"):
        await NPUStreamToolExecutor([aboom], handle_tool_errors=False).ainvoke(
            [tool_call("aboom", "1", x=1)])


async def test_no_calls_async() -> None:
    executor = NPUStreamToolExecutor([asleep])
    assert await executor.ainvoke({"messages": []}) == {"messages": []}
    assert await executor.ainvoke([]) == []


class _Parents(BaseCallbackHandler):
    def __init__(self) -> None:
        self.chain_ids: dict[str, Any] = {}
        self.tool_parents: list[Any] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.chain_ids[kwargs.get("name", "")] = run_id

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                      parent_run_id: Any = None, **kwargs: Any) -> None:
        self.tool_parents.append(parent_run_id)


async def test_tool_runs_are_children_in_async_mode() -> None:
    handler = _Parents()
    executor = NPUStreamToolExecutor([asleep, sleep_sync])
    await executor.ainvoke([tool_call("asleep", "a", seconds=0, tag=""),
                            tool_call("sleep_sync", "s", seconds=0, tag="")],
                           config={"callbacks": [handler]})
    assert handler.tool_parents == [handler.chain_ids["tools"]] * 2
