"""The fallback tool format: prompt text, history rendering, parsing and grammar agree (pure)."""

from __future__ import annotations

import itertools
import json

import pytest
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_ascend.chat import tool_format
from langchain_ascend.chat.tool_parsers import ToolCallStreamParser, parse_tool_calls
from langchain_ascend.structured import tool_call_grammar


@tool
def get_weather(city: str, days: int) -> str:
    """Weather forecast for a city over a number of days."""
    return "sunny"


TOOLS = [convert_to_openai_tool(get_weather)]


def _ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


def test_tools_section_holds_each_schema_as_json_and_the_call_instruction():
    section = tool_format.render_tools_section(TOOLS)
    body = section.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in body.splitlines()] == TOOLS
    assert ('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>") in section
    assert "<tool_response></tool_response>" in section


def test_a_rendered_call_parses_back_to_the_same_call():
    text = tool_format.render_call("get_weather", {"city": "東京", "days": 2})
    assert text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "days": 2}}\n</tool_call>'
    out = parse_tool_calls(text, "hermes", id_factory=_ids())
    assert [(c["name"], c["args"]) for c in out.tool_calls] == [
        ("get_weather", {"city": "東京", "days": 2})]
    assert out.content == "" and out.invalid_tool_calls == []


def test_parallel_calls_in_the_fallback_format_parse_in_order():
    calls = [
        {"type": "function", "id": "a", "function": {"name": "get_weather",
                                                    "arguments": {"city": "Paris", "days": 1}}},
        {"type": "function", "id": "b", "function": {"name": "get_weather",
                                                    "arguments": '{"city": "Rome", "days": 3}'}},
    ]
    text = "Checking both.\n" + tool_format.render_calls(calls)
    out = parse_tool_calls(text, "hermes", id_factory=_ids())
    assert out.content == "Checking both."
    assert [c["args"]["city"] for c in out.tool_calls] == ["Paris", "Rome"]
    assert [c["id"] for c in out.tool_calls] == ["id0", "id1"]


def test_malformed_fallback_calls_become_invalid_tool_calls():
    text = (
        tool_format.render_call("get_weather", {"city": "Paris", "days": 1})
        + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'
        + '\n<tool_call>\n{"arguments": {}}\n</tool_call>'
    )
    out = parse_tool_calls(text, "hermes", id_factory=_ids())
    assert [c["args"] for c in out.tool_calls] == [{"city": "Paris", "days": 1}]
    broken, nameless = out.invalid_tool_calls
    assert broken["name"] == "get_weather" and "invalid JSON" in broken["error"]
    assert broken["args"].startswith("<tool_call>")  # the raw text as the model wrote it
    assert nameless["name"] is None and "name" in nameless["error"]


def test_streamed_fallback_calls_match_the_one_shot_parse():
    text = "Sure.\n" + tool_format.render_call("get_weather", {"city": "Oslo", "days": 4})
    parser = ToolCallStreamParser("hermes", id_factory=_ids())
    content, calls = "", []
    for char in text:
        delta = parser.feed(char)
        content, calls = content + delta.content, calls + delta.calls
    tail = parser.finish()
    assert content + tail.content == "Sure."
    assert [(c.name, c.args) for c in calls + tail.calls] == [
        ("get_weather", {"city": "Oslo", "days": 4})]


def test_tool_response_keeps_name_call_id_and_result():
    block = tool_format.render_tool_response("get_weather", "call_7", "sunny\nand warm")
    assert block.startswith("<tool_response>\n") and block.endswith("\n</tool_response>")
    inner = block[len("<tool_response>\n") : -len("\n</tool_response>")]
    assert json.loads(inner) == {"name": "get_weather", "tool_call_id": "call_7",
                                 "content": "sunny\nand warm"}


def test_forced_call_grammar_writes_exactly_the_rendered_call_layout():
    tag = json.loads(tool_call_grammar(TOOLS, fmt="hermes", parallel=True).source)["format"]
    (only,) = tag["tags"]
    rendered = tool_format.render_call("get_weather", {"city": "x", "days": 1})
    assert rendered == only["begin"] + '{"city": "x", "days": 1}' + only["end"]
    assert tag["separator"] == tool_format.CALL_SEPARATOR


def test_marker_rewrites_for_each_kind():
    from langchain_ascend.testing.marker_tokens import rewrite_markers

    table = [{"id": 10, "content": "<tool_call>", "special": False},
             {"id": 11, "content": "<|box_start|>", "special": True}]
    special = rewrite_markers(table, ["<tool_call>", "[TOOL_CALLS]"], "special")
    assert [(e["id"], e["content"], e["special"]) for e in special] == [
        (10, "<tool_call>", True), (11, "[TOOL_CALLS]", True)]
    added = rewrite_markers(table, ["<tool_call>"], "added")
    assert added[0]["special"] is False and added[1] == table[1]
    plain = rewrite_markers(table, ["<tool_call>"], "plain")
    assert "<tool_call>" not in [e["content"] for e in plain]
    assert table[0]["content"] == "<tool_call>"  # the input is not modified
    with pytest.raises(ValueError, match="kind"):
        rewrite_markers(table, ["<tool_call>"], "odd")


def test_hermes_grammar_writes_special_markers_as_their_tokens():
    tools = [convert_to_openai_tool(get_weather)]
    spec = tool_call_grammar(tools, fmt="hermes",
                             special_tokens={"<tool_call>", "</tool_call>", "<|im_end|>"})
    assert set(spec.required_special_tokens) == {"<tool_call>", "</tool_call>"}
    call = json.loads(spec.source)["format"]["tags"][0]
    assert call["begin"] == {"type": "token", "token": "<tool_call>"}
    assert call["end"] == {"type": "token", "token": "</tool_call>"}
    plain = tool_call_grammar(tools, fmt="hermes", special_tokens={"<|im_end|>"})
    assert plain.required_special_tokens == ()
    assert json.loads(plain.source)["format"]["tags"][0]["begin"].startswith("<tool_call>")


def test_forced_call_without_a_parsed_call_is_an_error():
    from types import SimpleNamespace

    from langchain_ascend.chat.reply import ReplyAssembler
    from langchain_ascend.chat.results import check_forced_call
    from langchain_ascend.errors import ForcedOutputError

    prepared = SimpleNamespace(forced_tool=True, forced="tool call (tool_choice='any')")
    empty = ReplyAssembler(parse_tools=True, tool_format="hermes")
    empty.feed('\n{"name": "w", "arguments": {}}\n')
    empty.finish()
    with pytest.raises(ForcedOutputError, match="without a valid tool call"):
        check_forced_call(prepared, empty, "stop", '\n{"name": "w"}')
    check_forced_call(prepared, empty, "length", "")  # cut short: reported another way
    check_forced_call(SimpleNamespace(forced_tool=False, forced=None), empty, "stop", "")
    called = ReplyAssembler(parse_tools=True, tool_format="hermes")
    called.feed('<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>')
    called.finish()
    check_forced_call(prepared, called, "stop", "")
