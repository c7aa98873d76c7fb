"""Streamed tool calls reach OpenAI clients as argument fragments (id and name first only)."""

from __future__ import annotations

import json

from conftest import MODEL
from langchain_core.messages import AIMessageChunk
from serve_helpers import TOOLS

from langchain_ascend.serve.responses import ChunkWriter

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


def test_openai_sdk_receives_argument_pieces_that_add_up_to_the_call(client):
    whole = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                           tool_choice=FORCED, max_tokens=64)
    (call,) = whole.choices[0].message.tool_calls
    stream = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                            tool_choice=FORCED, max_tokens=64, stream=True)
    chunks = list(stream)
    fragments = [f for c in chunks if c.choices for f in c.choices[0].delta.tool_calls or []]
    assert fragments[0].index == 0 and fragments[0].id and fragments[0].type == "function"
    assert fragments[0].function.name == "get_weather"
    assert fragments[0].function.arguments == ""
    pieces = [f.function.arguments for f in fragments[1:] if f.function.arguments]
    assert len(pieces) >= 2, fragments
    assert all(f.index == 0 and f.id is None and f.function.name is None
               for f in fragments[1:])
    assert json.loads("".join(pieces)) == json.loads(call.function.arguments)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["tool_calls"]


def test_chunk_writer_passes_fragments_under_one_index():
    writer = ChunkWriter(model="m", include_usage=False)
    pieces = [{"name": "f", "args": "", "id": "c", "index": 0},
              {"name": None, "args": '{"a": ', "id": None, "index": 0},
              {"name": None, "args": "1}", "id": None, "index": 0},
              {"name": "g", "args": '{"b": 2}', "id": "d", "index": 1}]
    chunks = [c for p in pieces
              for c in writer.deltas(AIMessageChunk(content="", tool_call_chunks=[p]))]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0] == {"index": 0, "id": "c", "type": "function",
                        "function": {"name": "f", "arguments": ""}}
    assert calls[1:3] == [{"index": 0, "function": {"arguments": '{"a": '}},
                          {"index": 0, "function": {"arguments": "1}"}}]
    assert [c["index"] for c in calls[3:]] == [1, 1] and calls[3]["id"] == "d"
    assert json.loads(calls[4]["function"]["arguments"]) == {"b": 2}
