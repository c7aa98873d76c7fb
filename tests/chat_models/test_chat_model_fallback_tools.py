"""Tool calling on a chat template that ignores tools (SmolLM2-style ChatML): the fallback.

The schemas go into the system turn in the ``<tool_call>`` format, forced choices are
grammar-constrained in that format, and replies in it come back as ``tool_calls``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from chat_test_tools import get_time, get_weather
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from langchain_ascend.chat.tool_format import render_call
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.engine.core.outputs import RequestOutput, RequestStats, TokenDelta
from langchain_ascend.errors import ChatTemplateError


def _prompt_text(llm: AscendChatModel, messages, **kwargs) -> str:
    prepared = llm._prepare(messages, None, kwargs)
    return prepared.engine.tokenizer.decode(prepared.prompt_token_ids)


def _check_call(call):
    schema = {"get_weather": get_weather, "get_time": get_time}[call["name"]].args_schema
    schema.model_validate(call["args"])
    assert call["id"] and call["type"] == "tool_call"


def test_bound_tools_are_rendered_into_the_prompt(tiny_no_tools_chat, weather_tools):
    question = [HumanMessage("Weather in Paris?")]
    tools = tiny_no_tools_chat.bind_tools(weather_tools).kwargs["tools"]
    plain = _prompt_text(tiny_no_tools_chat, question)
    with_tools = _prompt_text(tiny_no_tools_chat, question, tools=tools)
    assert "get_weather" not in plain and "<tools>" not in plain
    for name in ("get_weather", "get_time"):
        assert f'"name": "{name}"' in with_tools
    assert "Weather forecast for a city over a number of days." in with_tools
    assert "<tool_call>\n{\"name\": <function-name>" in with_tools
    plain_reply = tiny_no_tools_chat.invoke(question, max_tokens=1)
    tools_reply = tiny_no_tools_chat.bind_tools(weather_tools).invoke(question, max_tokens=1)
    assert (tools_reply.usage_metadata["input_tokens"]
            > plain_reply.usage_metadata["input_tokens"] + 50)


def test_history_of_an_agent_hop_is_in_the_next_prompt(tiny_no_tools_chat, weather_tools):
    history = [
        HumanMessage("Weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris", "days": 2},
                                   "id": "call_abc"}]),
        ToolMessage("sunny in Paris for 2 days", tool_call_id="call_abc"),
    ]
    tools = tiny_no_tools_chat.bind_tools(weather_tools).kwargs["tools"]
    prompt = _prompt_text(tiny_no_tools_chat, history, tools=tools)
    assert render_call("get_weather", {"city": "Paris", "days": 2}) in prompt
    assert '"tool_call_id": "call_abc"' in prompt
    assert '"content": "sunny in Paris for 2 days"' in prompt
    assert "<|im_start|>user\n<tool_response>" in prompt


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_forced_calls_are_schema_valid_on_the_tool_less_template(tiny_no_tools_chat,
                                                                 weather_tools, choice):
    llm = tiny_no_tools_chat.bind_tools(weather_tools, tool_choice=choice)
    for seed in range(5):
        message = llm.invoke("What's the weather like?", temperature=1.0, seed=seed,
                             max_tokens=64)
        assert message.tool_calls and message.invalid_tool_calls == [], f"seed {seed}"
        assert message.response_metadata["finish_reason"] == "tool_calls"
        for call in message.tool_calls:
            _check_call(call)
            if choice != "required":
                assert call["name"] == choice


def test_tool_choice_none_on_the_fallback_never_calls(tiny_no_tools_chat, weather_tools):
    llm = tiny_no_tools_chat.bind_tools(weather_tools, tool_choice="none")
    for seed in range(3):
        reply = llm.invoke("Weather?", temperature=1.0, seed=seed, max_tokens=24)
        assert reply.tool_calls == [] and "<tool_call>" not in reply.content


@dataclass
class _ScriptedEngine:
    """Stands in for the engine: the real tokenizer and limits, a fixed reply."""

    real: object
    reply: str

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _output(self, prompt_ids):
        ids = self.real.tokenizer.encode(self.reply, add_special_tokens=False)
        stats = RequestStats(num_prompt_tokens=len(prompt_ids), num_generated_tokens=len(ids))
        return RequestOutput("r", list(prompt_ids), ids, self.reply, "stop", stats=stats)

    def generate(self, prompt_ids, params):
        return self._output(prompt_ids)

    def stream(self, prompt_ids, params):
        output = self._output(prompt_ids)
        tokenizer = self.real.tokenizer
        for i, token in enumerate(output.token_ids):
            last = i == len(output.token_ids) - 1
            yield TokenDelta("r", [token], tokenizer.decode([token]), finished=last,
                             finish_reason="stop" if last else None,
                             output=output if last else None)


def test_a_reply_in_the_fallback_format_becomes_tool_calls(tiny_no_tools_chat, weather_tools,
                                                           monkeypatch):
    reply = ("Let me check.\n" + render_call("get_weather", {"city": "Paris", "days": 3})
             + "\n" + render_call("get_time", {"timezone": "CET"}))
    engine = _ScriptedEngine(tiny_no_tools_chat._engine_for(), reply)
    monkeypatch.setattr(AscendChatModel, "_engine_for", lambda self, model=None: engine)
    llm = tiny_no_tools_chat.bind_tools(weather_tools)
    message = llm.invoke("Weather and time in Paris?")
    expected = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"timezone": "CET"})]
    assert [(c["name"], c["args"]) for c in message.tool_calls] == expected
    assert message.content == "Let me check."
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(llm.stream("Weather and time in Paris?"))
    # Each call streams: an opening chunk (id, name) then several argument fragments.
    openings = [t for c in chunks for t in c.tool_call_chunks if t["name"]]
    assert [(t["index"], t["name"], t["args"]) for t in openings] == [
        (0, "get_weather", ""), (1, "get_time", "")]
    assert sum(1 for c in chunks if c.tool_call_chunks) > 4
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == expected
    assert full.content == "Let me check."


def test_a_format_the_fallback_cannot_speak_is_a_typed_error(tiny_no_tools_path, weather_tools):
    llm = AscendChatModel(budget_closed_output="complete", model=str(tiny_no_tools_path), device="cpu", max_tokens=4,
                          tool_call_format="mistral")
    with pytest.raises(ChatTemplateError, match="does not render tools.*'mistral'"):
        llm.bind_tools(weather_tools).invoke("x")
    assert llm.invoke("x").content is not None  # without tools the model still works


def test_override_forces_the_fallback_on_a_template_that_renders_tools(tiny_qwen2_path,
                                                                       weather_tools):
    native = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", max_tokens=4)
    forced = native.model_copy(update={"tool_call_format": "fallback"})
    tools = native.bind_tools(weather_tools).kwargs["tools"]
    question = [HumanMessage("Weather?")]
    assert "You may call one or more functions to assist" in _prompt_text(
        native, question, tools=tools)  # the template's own (Qwen2.5) text
    fallback = _prompt_text(forced, question, tools=tools)
    assert fallback.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more "
                               "functions to help with the user's request.")
    message = forced.bind_tools(weather_tools, tool_choice="get_weather").invoke(
        "x", temperature=1.0, seed=0, max_tokens=64)
    (call,) = message.tool_calls
    _check_call(call)
