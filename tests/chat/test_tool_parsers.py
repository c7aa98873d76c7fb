"""Tool-call parsing on realistic outputs of each open-model format (pure, no model)."""

from __future__ import annotations

import itertools
import json

import pytest
from langchain_core.messages import AIMessageChunk

from langchain_ascend.chat.tool_parsers import (
    ToolCallStreamParser,
    detect_tool_call_format,
    new_tool_call_id,
    parse_tool_calls,
)


def _ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


def _stream(text: str, fmt: str, *, step: int = 1, tool_names=None):
    """Feed ``text`` in pieces of ``step`` characters; return (content, calls)."""
    parser = ToolCallStreamParser(fmt, tool_names=tool_names, id_factory=_ids())
    content, calls = "", []
    for start in range(0, len(text), step):
        delta = parser.feed(text[start : start + step])
        content += delta.content
        calls += delta.calls
    tail = parser.finish()
    return content + tail.content, calls + tail.calls


# --- Hermes / Qwen ------------------------------------------------------------------------

QWEN_TWO_CALLS = (
    "I'll check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius"}}\n'
    "</tool_call>"
)


def test_hermes_several_calls_with_content_and_unicode():
    out = parse_tool_calls(QWEN_TWO_CALLS, "hermes", id_factory=_ids())
    assert out.content == "I'll check both cities."
    assert [c["args"]["city"] for c in out.tool_calls] == ["Paris", "東京"]
    assert [c["id"] for c in out.tool_calls] == ["id0", "id1"]
    assert all(c["name"] == "get_weather" for c in out.tool_calls)
    assert out.invalid_tool_calls == []


def test_hermes_nested_arguments_survive():
    args = {"query": {"filters": [{"field": "price", "op": "<", "value": 10.5}], "limit": 3},
            "tags": ["a", "b"], "flag": None}
    text = f'<tool_call>\n{json.dumps({"name": "search", "arguments": args})}\n</tool_call>'
    out = parse_tool_calls(text, "hermes")
    assert out.tool_calls[0]["args"] == args
    assert out.content == ""


def test_hermes_broken_json_becomes_invalid_call_and_keeps_the_good_one():
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": }}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    out = parse_tool_calls(text, "hermes", id_factory=_ids())
    assert [c["args"] for c in out.tool_calls] == [{"a": 2, "b": 3}]
    (bad,) = out.invalid_tool_calls
    assert bad["name"] == "add"
    assert "invalid JSON" in bad["error"]
    assert bad["args"].startswith("<tool_call>") and '"b": }' in bad["args"]
    assert bad["id"] == "id0"


def test_hermes_unterminated_block_is_invalid_but_complete_json_is_accepted():
    cut = parse_tool_calls('Sure <tool_call>\n{"name": "add", "arguments": {"a": 1', "hermes")
    assert cut.content == "Sure"
    assert cut.tool_calls == []
    assert "unterminated" in cut.invalid_tool_calls[0]["error"]
    # A model that stops right after the JSON (forgetting </tool_call>) still made a call.
    done = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1}}', "hermes")
    assert done.tool_calls[0]["args"] == {"a": 1}


def test_hermes_arguments_given_as_json_string_and_missing_name():
    text = (
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": [1, 2]}</tool_call>'
    )
    out = parse_tool_calls(text, "hermes")
    assert out.tool_calls[0]["args"] == {"x": 1}
    errors = [c["error"] for c in out.invalid_tool_calls]
    assert "no string 'name'" in errors[0]
    assert "must be a JSON object" in errors[1]


def test_hermes_raw_newline_inside_a_string_is_tolerated():
    text = '<tool_call>\n{"name": "note", "arguments": {"text": "line one\nline two"}}\n</tool_call>'
    out = parse_tool_calls(text, "hermes")
    assert out.tool_calls[0]["args"] == {"text": "line one\nline two"}


def test_model_ids_are_kept_and_generated_ids_are_unique():
    text = '<tool_call>{"name": "f", "arguments": {}, "id": "abc"}</tool_call>'
    assert parse_tool_calls(text, "hermes").tool_calls[0]["id"] == "abc"
    generated = {new_tool_call_id() for _ in range(100)}
    assert len(generated) == 100
    assert all(i.startswith("call_") and len(i) == 29 for i in generated)


def test_text_without_calls_is_left_alone():
    text = "  Plain answer with a {brace} and <b>tags</b>.\n"
    for fmt in ("auto", "hermes", "mistral", "llama3_json"):
        out = parse_tool_calls(text, fmt)
        assert out.content == text
        assert out.tool_calls == out.invalid_tool_calls == []


# --- Llama 3.x ----------------------------------------------------------------------------


def test_llama_bare_json_call_and_several_separated_by_semicolons():
    one = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3_json")
    assert one.tool_calls[0]["name"] == "get_weather"
    assert one.tool_calls[0]["args"] == {"city": "Oslo"}
    two = parse_tool_calls(
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        "llama3_json",
    )
    assert [(c["name"], c["args"]) for c in two.tool_calls] == [("a", {"x": 1}), ("b", {})]


def test_llama_builtin_python_call():
    out = parse_tool_calls('<|python_tag|>brave_search.call(query="latest news", n=3)', "auto")
    assert out.tool_calls[0]["name"] == "brave_search"
    assert out.tool_calls[0]["args"] == {"query": "latest news", "n": 3}


def test_llama_json_that_is_not_a_call_stays_content():
    answer = '{"answer": 42, "unit": "m"}'
    assert parse_tool_calls(answer, "llama3_json").content == answer
    # With the bound tools known, a JSON reply naming no bound tool is content too.
    other = '{"name": "Bob", "parameters": {"age": 3}}'
    assert parse_tool_calls(other, "auto", tool_names=["get_weather"]).content == other
    assert parse_tool_calls(other, "auto", tool_names=["Bob"]).tool_calls[0]["name"] == "Bob"


def test_llama_broken_call_json_is_invalid():
    out = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Oslo"', "llama3_json")
    assert out.tool_calls == []
    assert out.invalid_tool_calls[0]["name"] == "get_weather"


# --- Mistral ------------------------------------------------------------------------------


def test_mistral_v3_array_with_ids():
    text = (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"},'
        ' {"name": "get_time", "arguments": {"tz": "Europe/Paris"}, "id": "f5g6h7i8j"}]'
    )
    out = parse_tool_calls(text, "mistral")
    assert [(c["name"], c["id"]) for c in out.tool_calls] == [
        ("get_weather", "a1b2c3d4e"), ("get_time", "f5g6h7i8j")]
    assert out.tool_calls[1]["args"] == {"tz": "Europe/Paris"}


def test_mistral_v11_name_args_format():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}[TOOL_CALLS]get_time[CALL_ID]x9[ARGS]{}'
    out = parse_tool_calls(text, "auto", id_factory=_ids())
    assert [(c["name"], c["args"], c["id"]) for c in out.tool_calls] == [
        ("get_weather", {"city": "Lyon"}, "id0"), ("get_time", {}, "x9")]


def test_mistral_broken_array_is_invalid_not_an_exception():
    out = parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}', "mistral")
    assert out.tool_calls == []
    assert out.invalid_tool_calls[0]["name"] == "f"
    assert out.invalid_tool_calls[0]["args"].startswith("[TOOL_CALLS]")


# --- streaming ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (QWEN_TWO_CALLS, "hermes"),
        (QWEN_TWO_CALLS, "auto"),
        ('Answer: <tool_call>{"name": "f", "arguments": {"a": [1, {"b": "x"}]}}</tool_call> ok',
         "hermes"),
        ('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]', "mistral"),
        ('{"name": "f", "parameters": {"a": 1}}', "llama3_json"),
        ("no calls here <tool but not a tag", "auto"),
        ('<tool_call>{"name": "f", "arguments": {"a": </tool_call>', "hermes"),
    ],
)
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streaming_in_any_pieces_matches_one_shot(text, fmt, step):
    whole = parse_tool_calls(text, fmt, id_factory=_ids())
    content, calls = _stream(text, fmt, step=step)
    assert content == whole.content
    assert [(c.name, c.args, c.error) for c in calls] == [
        (c.name, c.args, c.error) for c in whole.calls]


def test_streamed_content_is_released_before_the_call_completes():
    parser = ToolCallStreamParser("hermes")
    first = parser.feed("Let me look that up. <tool")
    assert first.content == "Let me look that up."  # "<tool" may begin a marker: held back
    second = parser.feed('_call>{"name": "f", "arguments": {}}')
    assert second.content == "" and second.calls == []
    third = parser.feed("</tool_call>")
    assert [c.name for c in third.calls] == ["f"]


def test_stream_chunks_aggregate_into_the_same_tool_calls():
    content, calls = _stream(
        QWEN_TWO_CALLS + '\n<tool_call>{"name": "x", "arguments": {"a": }</tool_call>', "hermes")
    chunks = [AIMessageChunk(content=content)] + [
        AIMessageChunk(content="", tool_call_chunks=[c.to_chunk()]) for c in calls]
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [c["args"]["city"] for c in full.tool_calls] == ["Paris", "東京"]
    assert len(full.invalid_tool_calls) == 1  # the broken call stays invalid after merging


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown tool call format"):
        ToolCallStreamParser("xml")  # type: ignore[arg-type]


def test_format_detection_from_chat_templates():
    assert detect_tool_call_format("...<tool_call>\\n{...}...") == "hermes"
    assert detect_tool_call_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_tool_call_format('{"name": function name, "parameters": ...}') == "llama3_json"
    assert detect_tool_call_format("{{ messages }}") == "auto"
    assert detect_tool_call_format(None) == "auto"


def test_reply_call_ids_repeat_with_the_prompt_and_differ_per_call():
    from langchain_ascend.chat.call_ids import reply_call_ids

    first, again, other = reply_call_ids([1, 2, 3]), reply_call_ids([1, 2, 3]), reply_call_ids([1, 2])
    ids = [first(), first()]
    assert ids == [again(), again()]
    assert ids[0] != ids[1] and other() not in ids
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)
