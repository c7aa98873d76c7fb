"""Fixtures for the timeline tests: a scripted chat model that reports what AscendChatModel
reports (usage with cache reads, engine timings, speculation figures), a few tools and a small
agent loop (model -> NPUStreamToolExecutor -> model) as an LCEL runnable."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from langchain_ascend.tools import NPUStreamToolExecutor


def reply(calls: list[dict[str, Any]], *, input_tokens: int, cached: int, output_tokens: int,
          speculative: dict[str, int] | None = None) -> AIMessage:
    """An AIMessage with AscendChatModel's usage and timing metadata."""
    metadata: dict[str, Any] = {
        "model_name": "scripted", "model_provider": "ascend",
        "finish_reason": "tool_calls" if calls else "stop",
        "timings": {"queue": 0.002, "time_to_first_token": 0.008, "decode": 0.010},
    }
    if speculative is not None:
        metadata["speculative"] = speculative
    return AIMessage(
        "" if calls else "done", tool_calls=calls,
        usage_metadata={"input_tokens": input_tokens, "output_tokens": output_tokens,
                        "total_tokens": input_tokens + output_tokens,
                        "input_token_details": {"cache_read": cached}},
        response_metadata=metadata)


class HopScriptedModel(BaseChatModel):
    """First hop (last message human): asks for the four tools; later hops answer. Stateless,
    so concurrent runs (``batch``) each get their own script; sleeps so hops have a length."""

    hop_s: float = 0.02

    @property
    def _llm_type(self) -> str:
        return "hop-scripted"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        time.sleep(self.hop_s)
        if isinstance(messages[-1], HumanMessage):
            calls = [{"name": name, "args": {"x": i}, "id": f"call-{name}", "type": "tool_call"}
                     for i, name in enumerate(("slow", "flaky", "broken", "hang"))]
            message = reply(calls, input_tokens=120, cached=0, output_tokens=30)
        else:
            message = reply([], input_tokens=200, cached=112, output_tokens=12,
                            speculative={"draft_tokens": 8, "accepted_tokens": 6,
                                         "forced_tokens": 2, "forward_passes": 4})
        return ChatResult(generations=[ChatGeneration(message=message)])


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
