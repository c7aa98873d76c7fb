"""The official ``openai`` SDK, sync and async, against the served tiny model."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import MODEL
from serve_helpers import TOOLS, sse_events

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_completion_has_openai_shape_and_usage(client):
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6)
    assert reply.object == "chat.completion" and reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert 1 <= usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_second_client_with_the_same_system_prompt_reads_the_cache(client):
    system = {"role": "system", "content": "You are a terse assistant. " * 30}
    first = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "one question"}],
        max_tokens=2)
    second = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "another question"}],
        max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64, (first.usage, second.usage)
    assert cached < second.usage.prompt_tokens


def test_stream_deltas_follow_the_contract(base_url):
    body = {"model": MODEL, "messages": USER, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_events(response.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert len({c["id"] for c in chunks}) == 1


def test_streamed_text_equals_the_whole_reply(client):
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8)
    stream = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8,
                                            stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_time"}}])
def test_forced_tool_call(client, choice):
    reply = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                           tool_choice=choice, max_tokens=64,
                                           parallel_tool_calls=False)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} if call.function.name == "get_weather" else {"timezone"}


def test_streamed_tool_call_fragments(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, max_tokens=64, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    fragments = [call for chunk in stream if chunk.choices
                 for call in chunk.choices[0].delta.tool_calls or []]
    assert fragments[0].index == 0 and fragments[0].id and fragments[0].type == "function"
    assert fragments[0].function.name == "get_weather"
    assert all(f.index == 0 and f.id is None and f.function.name is None
               for f in fragments[1:])
    arguments = "".join(f.function.arguments or "" for f in fragments)
    assert set(json.loads(arguments)) == {"city"}


def test_tool_choice_none_and_auto_answer(client):
    none = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                          tool_choice="none", max_tokens=8)
    assert not none.choices[0].message.tool_calls
    auto = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                          tool_choice="auto", max_tokens=8)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_results_in_the_history(client):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                           max_tokens=4)
    assert reply.usage.prompt_tokens > 0


def test_structured_output_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=96,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "forecast", "schema": schema,
                                         "strict": True}})
    assert reply.choices[0].finish_reason == "stop"
    data = json.loads(reply.choices[0].message.content)
    assert set(data) == {"city", "days"} and isinstance(data["days"], int)


def test_json_object_mode(client):
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64,
                                           response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut at max_tokens: a prefix of a JSON object
        assert reply.choices[0].message.content.lstrip().startswith("{")


async def test_async_client_concurrent_requests(async_client):
    import asyncio

    replies = await asyncio.gather(*[
        async_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=4)
        for i in range(4)])
    assert all(r.usage.completion_tokens >= 1 for r in replies)
    stream = await async_client.chat.completions.create(model=MODEL, messages=USER,
                                                        max_tokens=4, stream=True)
    finishes = [c.choices[0].finish_reason async for c in stream
                if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1


def test_models_lists_chat_and_embeddings(client):
    ids = [model.id for model in client.models.list()]
    assert ids == [MODEL, "minilm"]


def test_embeddings_float_and_base64(client):
    floats = client.embeddings.create(model="minilm", input=["hello", "world"],
                                      encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1]
    assert len(floats.data[0].embedding) == 384
    decoded = client.embeddings.create(model="minilm", input="hello")  # SDK asks base64
    assert decoded.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert floats.usage.prompt_tokens >= 2


def test_cached_tokens_never_exceed_the_prompt(client):
    """A forced call's reply starts with forced text the prefix cache may also hold: the
    usage still counts only prompt tokens as cached."""
    for _ in range(2):
        reply = client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, max_tokens=48,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        usage = reply.usage
        assert usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
