"""NPUStreamToolExecutor.invoke: order, concurrency bound, timeouts, retries, errors, bad input."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from tool_test_helpers import Gate, ai, tool_call

from langchain_ascend import NPUStreamToolExecutor
from langchain_ascend.errors import (
    InvalidRequestError,
    ToolCallError,
    ToolTimeoutError,
)


@tool
def wait(seconds: float, tag: str) -> str:
    """Sleep, then echo the tag."""
    time.sleep(seconds)
    return f"done {tag}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def boom(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


def test_order_ids_names_and_status_with_tools_of_different_speeds() -> None:
    executor = NPUStreamToolExecutor([wait, add])
    delays = [0.15, 0.0, 0.08, 0.03]
    calls = [tool_call("wait", f"w{i}", seconds=d, tag=str(i)) for i, d in enumerate(delays)]
    calls.insert(2, tool_call("add", "sum", a=2, b=3))
    start = time.perf_counter()
    out = executor.invoke(ai(*calls))
    elapsed = time.perf_counter() - start
    assert [m.tool_call_id for m in out] == ["w0", "w1", "sum", "w2", "w3"]
    assert [m.name for m in out] == ["wait", "wait", "add", "wait", "wait"]
    assert [m.content for m in out] == ["done 0", "done 1", "5", "done 2", "done 3"]
    assert all(isinstance(m, ToolMessage) and m.status == "success" for m in out)
    assert elapsed < sum(delays)  # ran concurrently, not one after another


def test_state_dict_in_state_dict_out() -> None:
    executor = NPUStreamToolExecutor([add])
    out = executor.invoke({"messages": [HumanMessage("hi"), ai(tool_call("add", "1", a=1, b=1))]})
    assert list(out) == ["messages"] and out["messages"][0].content == "2"


@pytest.mark.parametrize("limit", [1, 3])
def test_max_concurrency_is_a_hard_bound(limit: int) -> None:
    gate = Gate(target=limit)

    @tool
    def gated(i: int) -> int:
        """Counts concurrent callers."""
        gate.pass_through()
        return i

    executor = NPUStreamToolExecutor([gated], max_concurrency=limit)
    out = executor.invoke([tool_call("gated", f"c{i}", i=i) for i in range(3 * limit)])
    assert [m.content for m in out] == [str(i) for i in range(3 * limit)]
    assert gate.peak == limit and gate.entered == 3 * limit


def test_runnable_config_max_concurrency_and_enable_parallel() -> None:
    gate = Gate(target=2)

    @tool
    def gated(i: int) -> int:
        """Counts concurrent callers."""
        gate.pass_through()
        return i

    executor = NPUStreamToolExecutor([gated])
    executor.invoke([tool_call("gated", f"c{i}", i=i) for i in range(5)],
                    config={"max_concurrency": 2})
    assert gate.peak == 2
    serial = Gate(target=2, hold_s=0.05)

    @tool
    def gated_serial(i: int) -> int:
        """Counts concurrent callers."""
        serial.pass_through()
        return i

    out = NPUStreamToolExecutor([gated_serial], enable_parallel=False).invoke(
        [tool_call("gated_serial", f"c{i}", i=i) for i in range(3)])
    assert serial.peak == 1 and [m.content for m in out] == ["0", "1", "2"]


def test_without_a_limit_every_call_runs_at_once() -> None:
    gate = Gate(target=12)

    @tool
    def gated(i: int) -> int:
        """Counts concurrent callers."""
        gate.pass_through()
        return i

    NPUStreamToolExecutor([gated]).invoke([tool_call("gated", f"c{i}", i=i) for i in range(12)])
    assert gate.peak == 12


def test_timeout_answers_on_time_while_other_calls_succeed(release: threading.Event) -> None:
    @tool
    def hang(seconds: float) -> str:
        """Sleeps (up to 10 s here)."""
        release.wait(seconds)
        return "late"

    executor = NPUStreamToolExecutor([hang, add], timeout_ms=200)
    start = time.perf_counter()
    out = executor.invoke(ai(tool_call("add", "a", a=1, b=2), tool_call("hang", "h", seconds=10),
                             tool_call("add", "b", a=3, b=4)))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    assert [m.status for m in out] == ["success", "error", "success"]
    assert [m.content for m in out][::2] == ["3", "7"]
    assert "timed out after 200 ms" in out[1].content and out[1].tool_call_id == "h"
    assert out[1].response_metadata["tool_timing"]["timed_out"] is True
    assert executor.thread_stats().abandoned == 1
    release.set()
    deadline = time.monotonic() + 5
    while executor.thread_stats().abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert executor.thread_stats().abandoned == 0  # the thread came back to the pool


def test_retry_until_success_with_timing() -> None:
    failures = {"n": 0}

    @tool
    def flaky(x: int) -> str:
        """Fails twice, then works."""
        failures["n"] += 1
        if failures["n"] <= 2:
            raise ConnectionError("connection reset")
        return f"ok {x}"

    executor = NPUStreamToolExecutor([flaky], retry_times=2, retry_backoff_ms=1)
    (message,) = executor.invoke([tool_call("flaky", "f", x=5)])
    assert message.status == "success" and message.content == "ok 5"
    timing = message.response_metadata["tool_timing"]
    assert (timing["attempts"], timing["retries"], len(timing["attempt_ms"])) == (3, 2, 3)
    assert timing["retry_wait_ms"] > 0


def test_retries_are_bounded_and_only_for_retry_on() -> None:
    calls = {"conn": 0, "value": 0}

    @tool
    def always_conn(x: int) -> str:
        """Always loses the connection."""
        calls["conn"] += 1
        raise ConnectionError("down")

    @tool
    def always_value(x: int) -> str:
        """Always a bug."""
        calls["value"] += 1
        raise ValueError("bug")

    executor = NPUStreamToolExecutor([always_conn, always_value], retry_times=2,
                                     retry_backoff_ms=1)
    out = executor.invoke([tool_call("always_conn", "c", x=1), tool_call("always_value", "v", x=1)])
    assert calls == {"conn": 3, "value": 1}
    assert "ConnectionError: down" in out[0].content and out[0].status == "error"
    assert out[1].response_metadata["tool_timing"]["attempts"] == 1

    predicate = NPUStreamToolExecutor([always_value], retry_times=1, retry_backoff_ms=1,
                                      retry_on=lambda e: "bug" in str(e))
    predicate.invoke([tool_call("always_value", "v", x=1)])
    assert calls["value"] == 3


def test_timeouts_are_retried_only_when_asked(release: threading.Event) -> None:
    attempts = {"n": 0}

    @tool
    def slow_once(x: int) -> str:
        """Hangs on the first attempt only."""
        attempts["n"] += 1
        if attempts["n"] == 1:
            release.wait(10)
        return "second try"

    executor = NPUStreamToolExecutor([slow_once], timeout_ms=150, retry_on_timeout=True,
                                     retry_backoff_ms=1)
    (message,) = executor.invoke([tool_call("slow_once", "s", x=1)])
    assert message.status == "success" and message.content == "second try"
    assert message.response_metadata["tool_timing"]["attempts"] == 2

    attempts["n"] = 0
    no_retry = NPUStreamToolExecutor([slow_once], timeout_ms=150, retry_backoff_ms=1)
    (message,) = no_retry.invoke([tool_call("slow_once", "s", x=1)])
    assert message.status == "error" and attempts["n"] == 1
    # the message does not promise attempts that will not come
    assert "not retried" in message.content and "attempt 1 of" not in message.content

    @tool
    def always_slow(x: int) -> str:
        """Hangs on every attempt."""
        release.wait(10)
        return "late"

    retried = NPUStreamToolExecutor([always_slow], timeout_ms=100, retry_on_timeout=True,
                                    retry_times=1, retry_backoff_ms=1)
    (message,) = retried.invoke([tool_call("always_slow", "s", x=1)])
    assert message.status == "error" and "attempt 2 of 2" in message.content


def test_unknown_tool_invalid_args_and_tool_errors_become_messages() -> None:
    executor = NPUStreamToolExecutor([add, boom])
    out = executor.invoke([
        tool_call("nope", "1"),
        tool_call("add", "2", a="not a number", b=1),
        tool_call("boom", "3", message="kaput"),
        {"name": "add", "args": [1, 2], "id": "4"},
        tool_call("add", "5", a=1, b=1),
    ])
    assert [m.status for m in out] == ["error"] * 4 + ["success"]
    assert "no tool named 'nope'" in out[0].content and "add, boom" in out[0].content
    assert "invalid arguments for tool 'add'" in out[1].content and "a:" in out[1].content
    assert out[2].content == "Error: tool 'boom' raised ValueError: kaput"
    assert "must be a JSON object, got list" in out[3].content
    assert [m.tool_call_id for m in out] == ["1", "2", "3", "4", "5"]


def test_invalid_args_are_not_retried() -> None:
    executor = NPUStreamToolExecutor([add], retry_on=Exception, retry_backoff_ms=1)
    (message,) = executor.invoke([tool_call("add", "x", a="zz", b=1)])
    assert message.response_metadata["tool_timing"]["attempts"] == 1


def test_handle_tool_errors_variants() -> None:
    @tool
    def key_error(x: int) -> str:
        """Raises KeyError."""
        raise KeyError("missing")

    calls = [tool_call("boom", "b", message="m"), tool_call("key_error", "k", x=1)]
    fixed = NPUStreamToolExecutor([boom, key_error], handle_tool_errors="Tool failed.")
    assert [m.content for m in fixed.invoke(calls)] == ["Tool failed.", "Tool failed."]

    def only_values(e: ValueError) -> str:
        return f"value problem: {e}"

    typed = NPUStreamToolExecutor([boom, key_error], handle_tool_errors=only_values)
    assert typed.invoke(calls[:1])[0].content == "value problem: m"
    with pytest.raises(KeyError, match="missing"):
        typed.invoke(calls)

    by_type = NPUStreamToolExecutor([boom, key_error], handle_tool_errors=(KeyError,))
    assert by_type.invoke(calls[1:])[0].status == "error"
    with pytest.raises(ValueError, match="m"):
        by_type.invoke(calls)


def test_handle_tool_errors_false_propagates(release: threading.Event) -> None:
    @tool
    def hang(x: int) -> str:
        """Hangs."""
        release.wait(10)
        return "late"

    executor = NPUStreamToolExecutor([boom, add, hang], handle_tool_errors=False, timeout_ms=150)
    with pytest.raises(ValueError, match="kaput"):
        executor.invoke([tool_call("add", "1", a=1, b=1), tool_call("boom", "2", message="kaput")])
    with pytest.raises(ToolCallError, match="no tool named"):
        executor.invoke([tool_call("missing", "1")])
    with pytest.raises(ToolCallError, match="invalid arguments"):
        executor.invoke([tool_call("add", "1", a="x", b=1)])
    start = time.perf_counter()
    with pytest.raises(ToolTimeoutError):
        executor.invoke([tool_call("hang", "1", x=1)])
    assert time.perf_counter() - start < 1.0
    assert executor.invoke([tool_call("add", "ok", a=2, b=2)])[0].content == "4"  # still works


def test_bad_input_shapes() -> None:
    executor = NPUStreamToolExecutor([add])
    assert executor.invoke(AIMessage("no tools")) == []
    assert executor.invoke([]) == []
    assert executor.invoke([HumanMessage("hi")]) == []
    assert executor.invoke({"messages": [AIMessage("plain answer")]}) == {"messages": []}
    with pytest.raises(ToolCallError, match="no 'messages' key"):
        executor.invoke({"msgs": []})
    with pytest.raises(ToolCallError, match="int"):
        executor.invoke(3)


def test_duplicate_and_missing_ids() -> None:
    runs = {"n": 0}

    @tool
    def side_effect(x: int) -> str:
        """Counts runs."""
        runs["n"] += 1
        return "sent"

    executor = NPUStreamToolExecutor([side_effect])
    out = executor.invoke([tool_call("side_effect", "same", x=1),
                           tool_call("side_effect", "same", x=2),
                           {"name": "side_effect", "args": {"x": 3}}])
    assert runs["n"] == 2
    assert [m.status for m in out] == ["success", "error", "success"]
    assert "used by calls #0 and #1" in out[1].content
    assert out[2].tool_call_id == "side_effect-2"


def test_non_string_results() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    values: dict[str, Any] = {"dict": {"a": [1, 2]}, "none": None, "int": 7,
                              "opaque": Opaque(), "bytes": b"\x00", "list": [1, "x"]}

    @tool
    def give(kind: str) -> Any:
        """Returns a value of the given kind."""
        return values[kind]

    out = NPUStreamToolExecutor([give]).invoke([tool_call("give", k, kind=k) for k in values])
    assert [m.content for m in out] == ['{"a": [1, 2]}', "null", "7", "<opaque>", "b'\\x00'",
                                        '[1, "x"]']
    assert all(m.status == "success" for m in out)


def test_artifacts_injected_ids_and_tool_messages_are_kept() -> None:
    @tool(response_format="content_and_artifact")
    def search(query: str) -> tuple[str, dict[str, Any]]:
        """Search with an artifact."""
        return f"2 hits for {query}", {"hits": [1, 2]}

    @tool
    def echo_id(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Returns its own ToolMessage."""
        return ToolMessage(f"id={tool_call_id}", tool_call_id=tool_call_id, artifact=x)

    out = NPUStreamToolExecutor([search, echo_id]).invoke([
        tool_call("search", "s", query="npu"),
        tool_call("echo_id", "e", x=4, tool_call_id="forged-by-model")])
    assert out[0].content == "2 hits for npu" and out[0].artifact == {"hits": [1, 2]}
    assert out[1].content == "id=e" and out[1].artifact == 4
    assert "tool_timing" in out[1].response_metadata


def test_plain_functions_and_async_only_tools_run_from_invoke() -> None:
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool
    async def aping(x: int) -> str:
        """Async-only tool."""
        await asyncio.sleep(0.01)
        return f"pong {x}"

    out = NPUStreamToolExecutor([multiply, aping]).invoke(
        [tool_call("multiply", "m", a=3, b=4), tool_call("aping", "p", x=1)])
    assert [m.content for m in out] == ["12", "pong 1"]


def test_timing_metadata() -> None:
    (message,) = NPUStreamToolExecutor([wait]).invoke([tool_call("wait", "w", seconds=0.05,
                                                                 tag="t")])
    timing = message.response_metadata["tool_timing"]
    assert set(timing) >= {"queue_ms", "run_ms", "retry_wait_ms", "total_ms", "start_ms",
                           "end_ms", "attempts", "retries", "attempt_ms", "timed_out", "mode",
                           "stream"}
    assert timing["run_ms"] >= 45 and timing["end_ms"] >= timing["start_ms"] + 45
    assert timing["mode"] == "thread" and timing["stream"] is None


class _Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.chains: list[tuple[Any, Any, str]] = []
        self.tools: list[tuple[Any, Any, list[str]]] = []
        self.lock = threading.Lock()

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any,
                       parent_run_id: Any = None, **kwargs: Any) -> None:
        with self.lock:
            self.chains.append((run_id, parent_run_id, kwargs.get("name", "")))

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                      parent_run_id: Any = None, tags: list[str] | None = None,
                      **kwargs: Any) -> None:
        with self.lock:
            self.tools.append((run_id, parent_run_id, list(tags or [])))


def test_each_tool_run_is_a_child_of_the_executor_run() -> None:
    runs = _Runs()
    executor = NPUStreamToolExecutor([add, wait], name="my_tools")
    executor.invoke([tool_call("add", "1", a=1, b=1), tool_call("wait", "2", seconds=0, tag="")],
                    config={"callbacks": [runs], "tags": ["hop-1"]})
    (executor_run,) = [r for r in runs.chains if r[2] == "my_tools"]
    assert len(runs.tools) == 2
    assert all(parent == executor_run[0] for _, parent, _ in runs.tools)
    assert all("hop-1" in tags for _, _, tags in runs.tools)


def test_constructor_checks() -> None:
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        NPUStreamToolExecutor([add], timeout_ms=0)
    with pytest.raises(InvalidRequestError, match="retry_times"):
        NPUStreamToolExecutor([add], retry_times=-1)
    with pytest.raises(InvalidRequestError, match="max_concurrency"):
        NPUStreamToolExecutor([add], max_concurrency=0)
    with pytest.raises(InvalidRequestError, match="named 'add'"):
        NPUStreamToolExecutor([add, add])
    with pytest.raises(InvalidRequestError, match="retry_on"):
        NPUStreamToolExecutor([add], retry_on=3)  # type: ignore[arg-type]
    assert NPUStreamToolExecutor([add], timeout_ms=None).invoke(
        [tool_call("add", "1", a=1, b=2)])[0].content == "3"
