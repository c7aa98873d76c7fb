"""Fixtures for the timeline tests: four tools (ok, retried once, failing, past the deadline)
and a small agent loop (scripted model -> NPUStreamToolExecutor -> model) as an LCEL runnable."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from timeline_fakes import HopScriptedModel  # type: ignore[import-not-found]

from langchain_ascend.tools import NPUStreamToolExecutor


class _Flaky:
    """Fails the first attempt of each run (keyed by the run's question; thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def __call__(self, key: str) -> None:
        with self.lock:
            first = key not in self.seen
            self.seen.add(key)
        if first:
            raise ConnectionError("transient")


@pytest.fixture
def agent_tools() -> list[Any]:
    flaky_state = _Flaky()

    @tool
    def slow(x: int, run: str = "") -> int:
        """Sleep a little and echo x."""
        time.sleep(0.06)
        return x

    @tool
    def flaky(x: int, run: str = "") -> int:
        """Fail once, then echo x."""
        flaky_state(run)
        time.sleep(0.02)
        return x

    @tool
    def broken(x: int) -> int:
        """Always fails."""
        raise ValueError("broken tool")

    @tool
    def hang(x: int) -> int:
        """Runs past the executor's deadline."""
        time.sleep(0.6)
        return x

    return [slow, flaky, broken, hang]


@pytest.fixture
def agent(agent_tools: list[Any]) -> Any:
    """``{"question": str}`` -> final AIMessage: model, the executor (200 ms deadline, one
    retry on ConnectionError), model again."""
    model = HopScriptedModel()
    executor = NPUStreamToolExecutor(agent_tools, timeout_ms=200, retry_times=1,
                                     retry_backoff_ms=1, device="cpu")

    def run(inputs: dict[str, Any], config: Any) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(inputs["question"])]
        first = model.invoke(messages, config)
        for call in first.tool_calls:
            if call["name"] == "flaky":
                call["args"]["run"] = inputs["question"]
        results: list[ToolMessage] = executor.invoke(first, config)
        return model.invoke([*messages, first, *results], config)

    async def arun(inputs: dict[str, Any], config: Any) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(inputs["question"])]
        first = await model.ainvoke(messages, config)
        for call in first.tool_calls:
            if call["name"] == "flaky":
                call["args"]["run"] = inputs["question"]
        results = await executor.ainvoke(first, config)
        return await model.ainvoke([*messages, first, *results], config)

    return RunnableLambda(run, afunc=arun, name="agent")
