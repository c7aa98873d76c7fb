"""A forced call cut at ``max_tokens`` reads the same streamed and not: a tool call with
``finish_reason="length"`` whose arguments are the model's text and a closer, so that they
never parse - no client runs a call the budget cut short, whether its arguments were cut or
closed early by the budget guard (which makes them valid JSON the model did not finish)."""

from __future__ import annotations

import json

import pytest
from serve_helpers import TOOLS

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.serve.responses import ChunkWriter, completion_object


@pytest.fixture(scope="module")
def cutting_chat(tiny_qwen2_path) -> AscendChatModel:
    return AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0,
                           budget_closed_output="cut")


def streamed_reply(writer: ChunkWriter, chunks: list) -> tuple[dict, list[str]]:
    """(the tool call the stream built, its finish reasons) from the chunks' OpenAI deltas."""
    deltas = [d for chunk in chunks for d in writer.deltas(chunk)] + writer.finish(chunks[-1])
    call: dict = {}
    content = ""
    for body in deltas:
        delta = body["choices"][0]["delta"] if body["choices"] else {}
        content += delta.get("content") or ""
        for entry in delta.get("tool_calls", []):
            assert entry["index"] == 0
            if "id" in entry:
                call = {"id": entry["id"], "name": entry["function"]["name"], "arguments": ""}
            call["arguments"] += entry["function"]["arguments"]
    finishes = [b["choices"][0]["finish_reason"] for b in deltas if b["choices"]]
    return {**call, "content": content}, [f for f in finishes if f]


# 14 tokens cut the arguments; at 48 the budget guard closes the random model's string early
@pytest.mark.parametrize("max_tokens", [14, 48])
def test_a_cut_call_streams_as_it_is_answered_whole(cutting_chat, max_tokens):
    llm = cutting_chat.bind_tools(TOOLS[:1], tool_choice="get_weather", max_tokens=max_tokens)
    message = llm.invoke("Weather?")
    assert message.response_metadata["finish_reason"] == "length" and not message.tool_calls
    choice = completion_object(message, model="m")["choices"][0]
    assert choice["finish_reason"] == "length"
    (whole,) = choice["message"]["tool_calls"]
    assert whole["function"]["name"] == "get_weather"
    assert not (choice["message"]["content"] or "")  # the call is not repeated as text

    streamed, finishes = streamed_reply(ChunkWriter(model="m", include_usage=False),
                                        list(llm.stream("Weather?")))
    assert finishes == ["length"]
    assert streamed == {"id": whole["id"], "name": "get_weather",
                        "arguments": whole["function"]["arguments"], "content": ""}
    with pytest.raises(json.JSONDecodeError):
        json.loads(whole["function"]["arguments"])
    if max_tokens == 48:  # closed early: the model's text is JSON, the closer after it is not
        assert whole["function"]["arguments"].endswith("}]")
