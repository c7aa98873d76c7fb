"""The budget guard on the real SmolLM2-135M-Instruct (GGUF, greedy, CPU): ``max_tokens`` only
cuts a forced call short where closing would no longer fit.

* A greedy forced call that fits gives the same arguments under every budget it fits in
  (the guard once re-spelled forced text near the budget: "Weather in Beijing?" gave
  Bangkok at 50, 80 and 100 tokens and Beijing at 64 and 128).
* A forced call whose model repeats array items until the budget still closes, valid, within
  it (a case of ``benchmarks/bench_new_tools.py`` that was cut at 256 tokens while the guard
  let a token reaching past forced bytes through unchecked) -- and says it was shortened
  (``finish_reason="length"``, no call) unless ``budget_closed_output="complete"``.
* Where the guard takes away what the model was writing ("Bang" for "Bangladesh"), the call
  is no call: finish_reason "length", an invalid call.
"""

from __future__ import annotations

import jsonschema
import pytest

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs

pytestmark = needs_smollm2()

GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ITEM = {"type": "object", "properties": {
    "notes": {"type": "string", "description": "a name or place"},
    "priority": {"type": "string", "enum": ["fahrenheit", "blue", "celsius"]}},
    "required": ["priority"]}
SEARCH_PARCEL = {"type": "function", "function": {
    "name": "search_parcel_11", "description": "search parcel 11 for the user",
    "parameters": {"type": "object", "properties": {
        "date": {"type": "integer", "description": "a count"},
        "items": {"type": "array", "items": ITEM, "description": "a list of items"},
        "count": {"type": "array", "items": {"type": "object", "properties": {
            "date": {"type": "integer", "description": "a count"}}}},
        "language": {"type": "boolean"}, "owner": {"type": "integer"}},
        "required": ["date", "items"]}}}


@pytest.fixture(scope="module")
def chat() -> AscendChatModel:
    return AscendChatModel(**smollm2_chat_kwargs(speculative_decoding="off"))


def test_a_greedy_forced_call_does_not_depend_on_the_budget_it_fits_in(chat):
    bound = chat.bind_tools([GET_WEATHER], tool_choice="get_weather")
    calls = {budget: bound.invoke("Weather in Beijing?", max_tokens=budget).tool_calls
             for budget in (40, 50, 64, 80, 128)}
    assert all(len(found) == 1 for found in calls.values()), calls
    assert len({str(found[0]["args"]) for found in calls.values()}) == 1, calls


def test_a_repeating_call_still_closes_within_its_budget(chat):
    bound = chat.bind_tools([SEARCH_PARCEL], tool_choice="search_parcel_11")
    question = ("Please search parcel: date 13, items notes Oslo, priority fahrenheit, count "
                "date 8, language yes, owner 30.")
    for budget in (128, 256):
        reply = bound.invoke(question, max_tokens=budget, budget_closed_output="complete")
        assert reply.usage_metadata["output_tokens"] <= budget
        (call,) = reply.tool_calls
        jsonschema.validate(call["args"], SEARCH_PARCEL["function"]["parameters"])
        flagged = bound.invoke(question, max_tokens=budget)  # the model was still repeating
        assert flagged.tool_calls == [] and flagged.response_metadata["finish_reason"] == "length"
        (cut,) = flagged.invalid_tool_calls
        assert "closed early to fit max_tokens" in cut["error"] and call["args"]["date"] == 13


def test_a_call_the_guard_shortened_is_no_call(chat):
    bound = chat.bind_tools([GET_WEATHER], tool_choice="get_weather")
    for budget in (35, 36):  # "Bangladesh" needs more; the guard closed the string early
        reply = bound.invoke("Weather in Beijing?", max_tokens=budget)
        assert reply.tool_calls == [] and reply.response_metadata["finish_reason"] == "length"
        assert "closed early to fit max_tokens" in reply.response_metadata["output_error"]
        (call,) = bound.invoke("Weather in Beijing?", max_tokens=budget,
                               budget_closed_output="complete").tool_calls
        assert call["args"]["city"].startswith("Bang") and call["args"]["city"] != "Bangladesh"


def test_a_call_cut_at_max_tokens_reaches_no_tool():
    """Cut ("Weather in Paris?" needs ~33 tokens): what the budget left of the call -- once a
    placeholder city "..." that parsed -- is an invalid call, invoked or streamed (a last
    fragment keeps the merged chunks invalid), and an agent runs no call of a cut reply."""
    from langchain_core.tools import tool

    from langchain_ascend import create_ascend_agent

    ran: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        ran.append(city)
        return "sunny"

    chat = AscendChatModel(**smollm2_chat_kwargs())  # speculation on: "..." parsed at 24
    bound = chat.bind_tools([get_weather], tool_choice="required")
    for budget in (20, 24, 28):
        reply = bound.invoke("Weather in Paris?", max_tokens=budget)
        assert reply.response_metadata["finish_reason"] == "length"
        assert reply.tool_calls == [] and len(reply.invalid_tool_calls) == 1
        assert f"max_tokens={budget}" in reply.invalid_tool_calls[0]["error"]
        chunks = list(bound.stream("Weather in Paris?", max_tokens=budget))
        merged = chunks[0]
        for chunk in chunks[1:]:
            merged = merged + chunk
        assert merged.tool_calls == [] and len(merged.invalid_tool_calls) == 1, budget
        assert merged.chunk_position == "last" and merged.usage_metadata["output_tokens"] > 0
    agent = create_ascend_agent(chat.model_copy(update={"max_tokens": 24}), [get_weather],
                                first_hop_tool_choice="required")
    for _ in agent.stream({"messages": [("user", "Weather in Paris?")]}):
        pass
    assert ran == []


def test_a_call_cut_in_its_opening_marker_holds_its_text_once(chat):
    """Cut after a token or three of ``<tool_call>``: that text is the call's beginning, kept
    in the invalid call only (it stood in the content too: the server's reply showed '<<')."""
    bound = chat.bind_tools([GET_WEATHER], tool_choice="required")
    for budget in (1, 3):
        reply = bound.invoke("Weather in Paris?", max_tokens=budget)
        assert reply.response_metadata["finish_reason"] == "length" and reply.content == ""
        (cut,) = reply.invalid_tool_calls
        assert cut["args"] and "<tool_call>".startswith(cut["args"])
