"""Speculative decoding and grammar jump-forward through the chat model (tiny random qwen2).

Greedy replies equal with ``speculative_decoding`` on or off; forced tool calls and structured
output jump over the grammar's fixed text; ``response_metadata["speculative"]`` reports it;
bad values are typed errors.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError

QUESTION = [HumanMessage("Repeat after me: one two three four, one two three four, one two")]


def test_greedy_reply_identical_on_and_off(tiny_chat):
    off = tiny_chat.invoke(QUESTION, max_tokens=40, speculative_decoding="off")
    on = tiny_chat.invoke(QUESTION, max_tokens=40, speculative_decoding="prompt_lookup")
    assert on.content == off.content
    assert on.usage_metadata["output_tokens"] == off.usage_metadata["output_tokens"]
    spec_off, spec_on = off.response_metadata["speculative"], on.response_metadata["speculative"]
    assert spec_off["draft_tokens"] == 0
    # one pass per generated token (output_tokens counts a final stop token too)
    assert spec_off["forward_passes"] == off.usage_metadata["output_tokens"]
    assert spec_on["forward_passes"] == spec_off["forward_passes"] - spec_on["accepted_tokens"]


def test_streamed_reply_identical_on_and_off(tiny_chat):
    off = "".join(c.content for c in tiny_chat.stream(QUESTION, max_tokens=40,
                                                      speculative_decoding="off"))
    on = "".join(c.content for c in tiny_chat.stream(QUESTION, max_tokens=40,
                                                     speculative_decoding="auto"))
    assert on == off


def test_forced_tool_call_jumps_forward(tiny_chat, weather_tools):
    bound = tiny_chat.bind_tools(weather_tools, tool_choice="get_weather")
    on = bound.invoke([HumanMessage("Weather in Paris?")], max_tokens=60)
    off = bound.invoke([HumanMessage("Weather in Paris?")], max_tokens=60,
                       speculative_decoding="off")
    for message in (on, off):
        (call,) = message.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
    spec = on.response_metadata["speculative"]
    assert spec["forced_tokens"] >= 5  # the call's fixed syntax and the tool's name
    assert (spec["forward_passes"] + spec["forced_tokens"] + spec["accepted_tokens"]
            == on.usage_metadata["output_tokens"])
    assert off.response_metadata["speculative"]["forced_tokens"] == 0


def test_structured_output_jumps_over_keys(tiny_chat):
    class Answer(BaseModel):
        city: str
        population: int

    structured = tiny_chat.with_structured_output(Answer, method="json_schema", include_raw=True)
    out = structured.invoke("Largest city?", max_tokens=60)
    assert isinstance(out["parsed"], Answer)
    assert out["raw"].response_metadata["speculative"]["forced_tokens"] > 0


@pytest.mark.parametrize("kwargs,error", [
    ({"speculative_decoding": "ngram"}, InvalidRequestError),
    ({"num_speculative_tokens": 17}, InvalidRequestError),
    ({"num_speculative_tokens": "4"}, InvalidArgumentTypeError),
])
def test_bad_speculation_settings_are_typed_errors(tiny_chat, kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        tiny_chat.invoke("hi", **kwargs)


def test_bad_speculation_field_fails_at_construction(tiny_qwen2_path):
    with pytest.raises(Exception, match="speculative_decoding"):
        AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), speculative_decoding="always")

