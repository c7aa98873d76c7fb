"""AscendAgent.stream / astream: event order (hop 1's chunks, its reply, its tool results, hop 2's
chunks ... final), chunks that add up to each reply, and the same result as invoke."""

from __future__ import annotations

from typing import Any

from agent_test_helpers import call, scripted
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.tools import tool

from langchain_ascend import create_ascend_agent
from langchain_ascend.agent import HOP_LIMIT_REASON, AgentEvent
from langchain_ascend.agent.loop import join_chunks


@tool
def weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


def script() -> list[AIMessage]:
    return [
        AIMessage("Let me check both cities.",
                  tool_calls=[call("weather", "w1", city="Oslo"), call("nope", "n1")]),
        AIMessage("Oslo is sunny today."),
    ]


def summary(events: list[AgentEvent]) -> list[tuple[str, int]]:
    """Consecutive events of one kind and hop collapsed into one entry."""
    out: list[tuple[str, int]] = []
    for event in events:
        if not out or out[-1] != (event.kind, event.hop):
            out.append((event.kind, event.hop))
    return out


def check_events(events: list[AgentEvent], model_calls: list[dict[str, Any]]) -> None:
    assert summary(events) == [("message_chunk", 1), ("message", 1), ("tool_result", 1),
                               ("message_chunk", 2), ("message", 2), ("final", 2)]
    assert all(c["stream"] for c in model_calls)  # the model's own stream was used
    chunks = [e.message for e in events if e.kind == "message_chunk"]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    hop1 = "".join(str(e.message.content) for e in events if e.kind == "message_chunk"
                   and e.hop == 1)
    assert hop1 == "Let me check both cities."
    replies = [e.message for e in events if e.kind == "message"]
    assert replies[0].content == hop1 and isinstance(replies[0], AIMessage)
    assert [c["id"] for c in replies[0].tool_calls] == ["w1", "n1"]  # parsed from the chunks
    results = [e.message for e in events if isinstance(e.message, ToolMessage)]
    assert [e.kind for e in events if e.message in results] == ["tool_result"] * 2
    assert [(m.tool_call_id, m.status) for m in results] == [("w1", "success"), ("n1", "error")]
    final = events[-1]
    assert final.message.content == "Oslo is sunny today." and final.output is not None
    messages = final.output["messages"]
    assert messages[-1] is final.message
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage"]
    # the model's second hop saw the streamed reply (with its calls) and both results
    assert model_calls[1]["messages"][1].tool_calls == replies[0].tool_calls
    assert [m.tool_call_id for m in model_calls[1]["messages"][2:]] == ["w1", "n1"]


def test_stream_yields_chunks_then_tool_results_then_the_next_hop() -> None:
    model = scripted(*script())
    events = list(create_ascend_agent(model, [weather]).stream("Weather in Oslo?"))
    check_events(events, model.calls)
    invoked = create_ascend_agent(scripted(*script()), [weather]).invoke("Weather in Oslo?")
    streamed = events[-1].output
    assert streamed is not None
    assert [(type(m), m.content) for m in streamed["messages"]] == [
        (type(m), m.content) for m in invoked["messages"]]


async def test_astream_yields_the_same_order() -> None:
    model = scripted(*script())
    events = [e async for e in create_ascend_agent(model, [weather]).astream("Weather in Oslo?")]
    check_events(events, model.calls)


def test_stream_at_the_hop_limit_ends_with_the_notice() -> None:
    model = scripted(AIMessage("", tool_calls=[call("weather", "w1", city="A")]))
    events = list(create_ascend_agent(model, [weather], max_hops=1).stream("q"))
    assert summary(events) == [("message_chunk", 1), ("message", 1), ("tool_result", 1),
                               ("final", 1)]
    assert events[-1].message.response_metadata["finish_reason"] == HOP_LIMIT_REASON


def test_join_chunks() -> None:
    whole = AIMessage("not streamed")
    assert join_chunks([whole]) is whole  # a model without streaming yields its reply once
    assert join_chunks([]).content == ""
    joined = join_chunks([AIMessageChunk(content="a"), AIMessageChunk(content=" b", tool_call_chunks=[
        {"name": "weather", "args": '{"city": "X"}', "id": "c", "index": 0,
         "type": "tool_call_chunk"}], chunk_position="last")])
    assert type(joined) is AIMessage and joined.content == "a b"
    assert joined.tool_calls == [call("weather", "c", city="X")]
