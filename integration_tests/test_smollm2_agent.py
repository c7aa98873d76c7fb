"""Tool calling on the real SmolLM2-135M-Instruct, whose ChatML template ignores ``tools``: the
chat model writes the schemas into the system turn in the Hermes ``<tool_call>`` fallback format,
forced calls follow the question, and the next hop reads the call and its result.

Greedy decoding, so every reply here is deterministic. What depends on the model's own choice
in ``"auto"`` mode (calling a tool unprompted) is not asserted: a 135M model answers in prose.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs

pytestmark = needs_smollm2()

WEATHER_RESULT = "4°C, clear"


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER_RESULT


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 2 * (3 + 4)."""
    return "391"


@tool
def web_search(query: str) -> str:
    """Search the web and return the top result for a query."""
    return "No results."


TOOLS = [get_weather, calculator, web_search]
TOOLS_BY_NAME = {t.name: t for t in TOOLS}


@pytest.fixture(scope="module")
def llm() -> AscendChatModel:
    """One chat model (and so one engine) for the whole module."""
    return AscendChatModel(**smollm2_chat_kwargs(max_tokens=64))


def rendered(llm: AscendChatModel, messages: list[BaseMessage], **kwargs: Any) -> tuple[str, int]:
    """The prompt text the engine receives for ``messages`` with these call arguments, and its
    number of tokens."""
    prepared = llm._prepare(messages, None, kwargs)
    ids = prepared.prompt_token_ids
    return prepared.engine.tokenizer.decode(ids), len(ids)


def bound_kwargs(llm: AscendChatModel, **choice: Any) -> dict[str, Any]:
    return dict(llm.bind_tools(TOOLS, **choice).kwargs)  # type: ignore[attr-defined]


def weather_history() -> list[BaseMessage]:
    call = {"name": "get_weather", "args": {"city": "Beijing"}, "id": "call_1", "type": "tool_call"}
    return [HumanMessage("What is the weather in Beijing?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage(WEATHER_RESULT, tool_call_id="call_1", name="get_weather")]


def test_bound_tools_are_in_the_prompt(llm):
    question = [HumanMessage("What is the weather in Beijing?")]
    plain_text, plain_tokens = rendered(llm, question)
    tools_text, tools_tokens = rendered(llm, question, **bound_kwargs(llm))
    for t in TOOLS:
        assert t.name not in plain_text
        assert t.name in tools_text and t.description in tools_text
    assert "<tools>" in tools_text and "<tool_call>" in tools_text
    assert tools_tokens > plain_tokens + 50
    # what the engine was given, as the reply reports it
    plain = llm.invoke(question, max_tokens=1)
    with_tools = llm.bind_tools(TOOLS).invoke(question, max_tokens=1)
    assert plain.usage_metadata["input_tokens"] == plain_tokens
    assert with_tools.usage_metadata["input_tokens"] == tools_tokens


@pytest.mark.parametrize(("question", "name", "argument", "needles"), [
    # Not Beijing: there the city's first token is a near tie in float64 ('Be' -1.17 vs 'B'
    # -1.31 log-prob), so float rounding picks 'Beijing' on one VM and 'Bangkok' on another at
    # the same commit. Tokyo: get_weather leads the other names by 2.5 nats, 'To' by 1.3.
    ("What is the weather in Tokyo?", "get_weather", "city", ["Tokyo"]),
    # SmolLM2's own greedy argument is '23' under every budget (measured); '17 * 23}}</tool_
    # call}...' at max_tokens=64 was the budget guard re-spelling forced text near the end.
    ("What is 17 * 23?", "calculator", "expression", ["23"]),
    pytest.param("Search the web for the height of the Eiffel Tower.", "web_search", "query",
                 ["Eiffel"], marks=pytest.mark.xfail(strict=True, reason=(
                     "SmolLM2-135M, forced to call, picks get_weather(city='Paris') instead "
                     "of web_search for an explicit web-search request (greedy, measured)"))),
])
def test_a_forced_call_picks_the_tool_and_arguments_from_the_question(
        llm, question, name, argument, needles):
    reply = llm.bind_tools(TOOLS, tool_choice="required").invoke(question)
    assert len(reply.tool_calls) >= 1, reply
    call = reply.tool_calls[0]
    assert call["name"] == name, reply.tool_calls
    value = str(call["args"].get(argument, ""))
    for needle in needles:
        assert needle.lower() in value.lower(), call


def test_the_second_hop_prompt_holds_the_call_and_its_result(llm):
    text, _ = rendered(llm, weather_history(), **bound_kwargs(llm))
    call_at = text.index('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Beijing"}}')
    # (the system turn names the <tool_response> markers too: the result block comes later)
    result_at = text.index("<tool_response>\n{", call_at)
    assert "<|im_start|>user" in text[call_at:result_at]  # a role the template knows
    response = text[result_at:text.index("</tool_response>", result_at)]
    assert '"get_weather"' in response and "call_1" in response
    assert f'"content": "{WEATHER_RESULT}"' in response
    assert text.rstrip().endswith("<|im_start|>assistant")


@pytest.mark.xfail(strict=True, reason=(
    "SmolLM2-135M copies the last <tool_response> block back (name, call id, content) instead "
    "of answering; a restatement of the result in plain words after the block, an instruction "
    "to answer, and a grammar that excludes the marker did not change that (measured)"))
def test_an_agent_loop_with_a_forced_first_hop_answers_from_the_tool_result(llm):
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Beijing?")]
    forced = llm.bind_tools(TOOLS, tool_choice="required")
    free = llm.bind_tools(TOOLS)
    for hop in range(4):
        reply = (forced if hop == 0 else free).invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(TOOLS_BY_NAME[call["name"]].invoke(call))
    else:
        pytest.fail(f"no final answer after 4 hops: {messages}")
    assert messages[1].tool_calls[0]["name"] == "get_weather"
    assert isinstance(messages[2], ToolMessage) and messages[2].content == WEATHER_RESULT
    answer = messages[-1].content
    assert isinstance(answer, str) and "4" in answer, answer
    # An answer, not a copy of the tool result block.
    assert "<tool_response>" not in answer and "tool_call_id" not in answer, answer
