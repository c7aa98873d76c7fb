"""The server's pure parts, without a server: field paths of errors, request conversion,
response and chunk building, the admission queue."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage

from langchain_ascend.errors import InvalidArgumentTypeError, PromptTooLongError
from langchain_ascend.serve.admission import Admission
from langchain_ascend.serve.convert import call_kwargs, to_messages
from langchain_ascend.serve.http_errors import APIError, from_typed_error, param_of
from langchain_ascend.serve.openai_types import ChatCompletionRequest
from langchain_ascend.serve.responses import ChunkWriter, completion_object, openai_usage


@pytest.mark.parametrize("loc,param", [
    (("body", "temperature"), "temperature"),
    (("body", "messages", 2, "content"), "messages[2].content"),
    (("body", "tool_choice", "literal['auto','none','required']"), "tool_choice"),
    (("body", "tool_choice", "NamedToolChoice", "function", "name"), "tool_choice"),
    (("body",), None),
])
def test_param_of_error_locations(loc, param):
    assert param_of(loc) == param


def test_typed_errors_name_the_field():
    assert from_typed_error(PromptTooLongError("too long")).param == "messages"
    error = from_typed_error(InvalidArgumentTypeError("max_tokens must be an integer"))
    assert (error.status, error.param) == (400, "max_tokens")
    assert from_typed_error(RuntimeError("boom")).status == 500


def request(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_call_kwargs_map_openai_fields():
    kwargs = call_kwargs(request(max_completion_tokens=5, max_tokens=9, stop="END", seed=3,
                                 temperature=0.5, response_format={"type": "text"}))
    assert kwargs == {"max_tokens": 5, "max_tokens_overflow": "error", "stop": ["END"],
                      "seed": 3, "temperature": 0.5}
    fmt = call_kwargs(request(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}))
    assert fmt["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_penalties_pass_only_where_the_model_has_them():
    with pytest.raises(APIError) as info:
        call_kwargs(request(presence_penalty=0.5))
    assert info.value.param == "presence_penalty"
    assert call_kwargs(request(presence_penalty=0.5), penalties=True)["presence_penalty"] == 0.5


def test_messages_convert_with_tool_calls():
    converted = to_messages(request(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                     "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]).messages)
    assert converted[1] == HumanMessage(content="ab")
    assert isinstance(converted[2], AIMessage) and converted[2].tool_calls[0]["id"] == "c1"
    assert isinstance(converted[3], ToolMessage)


def test_completion_object_with_calls():
    message = AIMessage(content="", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c"}],
                        usage_metadata={"input_tokens": 10, "output_tokens": 3,
                                        "total_tokens": 13,
                                        "input_token_details": {"cache_read": 8}},
                        response_metadata={"finish_reason": "stop"})
    body = completion_object(message, model="m")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}


def test_chunk_writer_contract():
    writer = ChunkWriter(model="m", include_usage=True)
    chunks = writer.deltas(AIMessageChunk(content="Hi"))
    chunks += writer.deltas(AIMessageChunk(content="", tool_call_chunks=[
        {"name": "f", "args": '{"a": 1}', "id": "c", "index": 0}]))
    chunks += writer.deltas(AIMessageChunk(content="", tool_call_chunks=[
        {"name": None, "args": "<tool_call>{broken", "id": "d", "index": 1}]))
    last = AIMessageChunk(content="", response_metadata={"finish_reason": "stop"},
                          usage_metadata={"input_tokens": 4, "output_tokens": 2,
                                          "total_tokens": 6})
    chunks += writer.deltas(last) + writer.finish(last)
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": "Hi"}
    assert deltas[2]["tool_calls"][0] == {"index": 0, "id": "c", "type": "function",
                                         "function": {"name": "f", "arguments": ""}}
    assert deltas[3]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert deltas[4] == {"content": "<tool_call>{broken"}  # an unparsed call stays text
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["tool_calls"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == openai_usage(
        last.usage_metadata)


def test_admission_bounds_the_queue():
    gate = Admission(capacity=2, max_waiting=1)
    for _ in range(3):
        gate.enter()
    assert gate.waiting == 1
    with pytest.raises(APIError) as info:
        gate.enter()
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
    gate.leave()
    gate.enter()


def test_completion_object_answers_only_the_last_cut_call_as_a_call():
    """Of a reply cut at max_tokens, the cut call (the last invalid one) is a tool call whose
    arguments never parse; an earlier malformed call, a list of calls (Mistral) or string
    arguments stay text, as the model wrote them."""
    def invalid(raw, name="f", id_="c1"):
        return {"name": name, "args": raw, "id": id_, "error": "cut", "type": "invalid_tool_call"}

    cut = invalid('<tool_call>\n{"name": "g", "arguments": {"b": "Ban', name="g", id_="c2")
    broken = invalid('<tool_call>\n{"name": "f", "arguments": {"a": 1}, }\n</tool_call>')
    message = AIMessage(content="", invalid_tool_calls=[broken, cut],
                        response_metadata={"finish_reason": "length"})
    choice = completion_object(message, model="m")["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("c2", "g")
    assert call["function"]["arguments"].startswith('{"b": "Ban')
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])
    assert choice["message"]["content"] == broken["args"] and choice["finish_reason"] == "length"
    for raw in ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arg',
                '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1'):
        listed = AIMessage(content="", invalid_tool_calls=[invalid(raw)],
                           response_metadata={"finish_reason": "length"})
        body = completion_object(listed, model="m")["choices"][0]["message"]
        assert "tool_calls" not in body and body["content"] == raw
    stopped = AIMessage(content="", invalid_tool_calls=[cut],
                        response_metadata={"finish_reason": "stop"})
    assert "tool_calls" not in completion_object(stopped, model="m")["choices"][0]["message"]
