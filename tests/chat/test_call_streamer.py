"""Tool calls stream as fragments: the opening (index, id, name), then the argument text."""

from __future__ import annotations

import itertools
import json

import pytest
from langchain_core.messages import AIMessageChunk

from langchain_ascend.chat.tool_parsers import ToolCallStreamParser, parse_tool_calls

HERMES_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris", '
               '"days": [1, 2], "opts": {"unit": "C", "note": "a}b"}}}\n</tool_call>')
LLAMA_CALL = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'
BARE_CALL = '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'


def _stream(text, fmt, *, step=2, tool_names=None):
    counter = itertools.count()
    parser = ToolCallStreamParser(fmt, tool_names=tool_names,
                                  id_factory=lambda: f"call_{next(counter)}")
    deltas = [parser.feed(text[i:i + step]) for i in range(0, len(text), step)]
    deltas.append(parser.finish())
    return [chunk for delta in deltas for chunk in delta.chunks], [
        call for delta in deltas for call in delta.calls]


def _merged(chunks):
    messages = [AIMessageChunk(content="", tool_call_chunks=[c]) for c in chunks]
    return sum(messages[1:], messages[0])


@pytest.mark.parametrize(("text", "fmt", "names"), [
    (HERMES_CALL, "hermes", None), (HERMES_CALL, "auto", None),
    (LLAMA_CALL, "llama3_json", None), (BARE_CALL, "llama3_json", {"get_weather"}),
    ("Sure.\n" + HERMES_CALL, "auto", None),
])
def test_call_streams_as_opening_then_argument_fragments(text, fmt, names):
    chunks, calls = _stream(text, fmt, tool_names=names)
    whole = parse_tool_calls(text, fmt, tool_names=names)
    assert chunks[0] == {"name": "get_weather", "args": "", "id": "call_0", "index": 0,
                         "type": "tool_call_chunk"}
    rest = chunks[1:]
    assert len(rest) >= 2 and all(c["id"] is None and c["name"] is None and c["index"] == 0
                                  for c in rest)
    arguments = "".join(c["args"] for c in rest)
    assert json.loads(arguments) == whole.tool_calls[0]["args"] == calls[0].args
    merged = _merged(chunks)
    assert merged.tool_calls == [{"name": "get_weather", "args": calls[0].args,
                                  "id": "call_0", "type": "tool_call"}]


def test_raw_newlines_in_strings_stream_as_strict_json():
    chunks, calls = _stream('<tool_call>{"name": "f", "arguments": {"t": "a\nb"}}</tool_call>',
                            "hermes")
    assert json.loads("".join(c["args"] for c in chunks)) == calls[0].args == {"t": "a\nb"}


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut at max_tokens
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\',
    '<tool_call>\n{"name": "get_weather", "arguments": {"days": [1, 2',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}, x}</tool_call>',
])
def test_a_streamed_call_that_ends_invalid_merges_into_an_invalid_call(text):
    chunks, calls = _stream(text, "hermes")
    assert chunks[0]["name"] == "get_weather" and len(chunks) > 2
    assert not calls[0].valid and calls[0].id == "call_0"
    merged = _merged(chunks)
    assert merged.tool_calls == []
    assert [(c["name"], c["id"]) for c in merged.invalid_tool_calls] == [
        ("get_weather", "call_0")]


def test_two_calls_stream_under_their_own_indexes():
    text = HERMES_CALL + "\n" + HERMES_CALL.replace("get_weather", "get_time")
    chunks, calls = _stream(text, "hermes", step=3)
    merged = _merged(chunks)
    assert [(c["name"], c["id"]) for c in merged.tool_calls] == [
        ("get_weather", "call_0"), ("get_time", "call_1")]
    assert [c["args"] for c in merged.tool_calls] == [c.args for c in calls]


def test_shapes_that_do_not_stream_come_whole():
    args_first = '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>'
    chunks, calls = _stream(args_first, "hermes")
    assert len(chunks) == 1 and chunks[0]["name"] == "f" and calls[0].valid
    mistral = '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'
    chunks, calls = _stream(mistral, "mistral")
    assert len(chunks) == 1 and json.loads(chunks[0]["args"]) == {"a": 1}
    string_args = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    chunks, _ = _stream(string_args, "hermes")
    assert [c["args"] for c in chunks] == ["", '{"a": 1}']  # opening, then the args whole


def test_a_bare_json_reply_naming_no_bound_tool_stays_content():
    chunks, calls = _stream(BARE_CALL, "llama3_json", tool_names={"other"})
    assert chunks == [] and calls == []
