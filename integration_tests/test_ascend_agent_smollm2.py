"""create_ascend_agent on the real SmolLM2-135M-Instruct (CPU, greedy): the first hop forced to
call (the demo's pattern as one argument), the last allowed hop forced to answer. Two runs,
invoke and stream, on one engine; what the answer says is the model's business (a 135M model
often restates the tool result), so the loop's behaviour is what is asserted."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from langchain_ascend import create_ascend_agent
from langchain_ascend.agent import HOP_LIMIT_REASON
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs

pytestmark = needs_smollm2()

WEATHER = "Beijing: 4°C, clear, north wind 25 km/h"
QUESTION = "What is the weather in Beijing today?"
MAX_HOPS = 3


@tool
def get_weather(city: str) -> str:
    """Today's weather for a city."""
    return WEATHER


@pytest.fixture(scope="module")
def agent():
    llm = AscendChatModel(**smollm2_chat_kwargs(max_tokens=64))
    return create_ascend_agent(
        llm, [get_weather], max_hops=MAX_HOPS, first_hop_tool_choice="required",
        final_hop_tool_choice="none", parallel_tool_calls=False,
        system_prompt="You are a helpful assistant. Use the tools, then answer briefly.")


@pytest.fixture(scope="module")
def invoked(agent):
    return agent.invoke(QUESTION)


def test_a_forced_first_hop_runs_the_tool_and_the_run_ends_with_an_answer(invoked):
    messages = invoked["messages"]
    replies = [m for m in messages if isinstance(m, AIMessage)]
    assert 2 <= len(replies) <= MAX_HOPS
    (first_call,) = messages[1].tool_calls  # forced, one call
    assert first_call["name"] == "get_weather"
    result = messages[2]
    assert isinstance(result, ToolMessage) and result.content == WEATHER
    assert result.tool_call_id == first_call["id"] and result.status == "success"
    final = messages[-1]
    assert isinstance(final, AIMessage) and final.tool_calls == []
    assert final.response_metadata.get("finish_reason") != HOP_LIMIT_REASON
    assert str(final.content).strip()
    # hop 2 starts with hop 1's prompt: the engine served most of it from the prefix cache
    first, second = replies[0].usage_metadata, replies[1].usage_metadata
    assert first is not None and second is not None
    assert second["input_tokens"] > first["input_tokens"]
    assert second["input_token_details"]["cache_read"] >= first["input_tokens"] // 2


def test_stream_gives_the_same_run_as_invoke(agent, invoked):
    events = list(agent.stream(QUESTION))
    order = [e.kind for e in events]
    assert order[0] == "message_chunk" and order[-1] == "final"
    first_result = order.index("tool_result")
    assert all(e.hop == 1 for e in events[:first_result])
    assert events[first_result - 1].kind == "message"
    assert events[first_result + 1].kind == "message_chunk" and events[first_result + 1].hop == 2
    streamed = events[-1].output["messages"]
    assert [type(m) for m in streamed] == [type(m) for m in invoked["messages"]]
    assert [m.content for m in streamed] == [m.content for m in invoked["messages"]]  # greedy
    assert streamed[1].tool_calls[0]["args"] == invoked["messages"][1].tool_calls[0]["args"]
