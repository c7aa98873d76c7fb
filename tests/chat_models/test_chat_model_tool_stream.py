"""A forced tool call streams its arguments: opening chunk, then argument fragments."""

from __future__ import annotations

import json


def test_forced_call_streams_argument_fragments_that_add_up_to_invoke(tiny_chat,
                                                                       weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="get_weather",
                               parallel_tool_calls=False)
    kwargs = {"temperature": 1.0, "seed": 3, "max_tokens": 64}
    expected = llm.invoke("Weather?", **kwargs)
    (call,) = expected.tool_calls
    chunks = list(llm.stream("Weather?", **kwargs))
    pieces = [t for c in chunks for t in c.tool_call_chunks]
    assert pieces[0]["name"] == "get_weather" and pieces[0]["args"] == ""
    assert pieces[0]["id"] == call["id"] and pieces[0]["index"] == 0
    fragments = pieces[1:]
    assert len(fragments) >= 2, pieces
    assert all(f["index"] == 0 and f["id"] is None and f["name"] is None for f in fragments)
    assert json.loads("".join(f["args"] for f in fragments)) == call["args"]
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.tool_calls == expected.tool_calls and not full.invalid_tool_calls


def test_call_cut_at_max_tokens_streams_then_ends_invalid(tiny_chat, weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="get_weather")
    expected = llm.invoke("Weather?", temperature=1.0, seed=3, max_tokens=14)
    assert expected.invalid_tool_calls and not expected.tool_calls
    chunks = list(llm.stream("Weather?", temperature=1.0, seed=3, max_tokens=14))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert full.tool_calls == []
    assert [(c["name"], c["id"]) for c in full.invalid_tool_calls] == [
        (c["name"], c["id"]) for c in expected.invalid_tool_calls]
