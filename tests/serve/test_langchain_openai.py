"""``langchain_openai.ChatOpenAI`` pointed at the server, unchanged."""

from __future__ import annotations

import pytest
from conftest import MODEL
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from pydantic import BaseModel


@tool
def get_weather(city: str) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city}"


class Forecast(BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def chat_openai(base_url):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{base_url}/v1", api_key="unused", model=MODEL,
                      max_tokens=64, temperature=0, max_retries=0, timeout=120)


def test_invoke_has_usage_with_cache_reads(chat_openai):
    reply = chat_openai.invoke("Hello there", max_tokens=4)
    assert isinstance(reply.content, str)
    usage = reply.usage_metadata
    assert usage["output_tokens"] >= 1 and usage["input_tokens"] > 0
    assert "cache_read" in usage["input_token_details"]
    assert reply.response_metadata["model_name"] == MODEL


def test_bind_tools_named_choice(chat_openai):
    reply = chat_openai.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "Weather in Paris?")
    assert [call["name"] for call in reply.tool_calls] == ["get_weather"]
    assert set(reply.tool_calls[0]["args"]) == {"city"} and reply.tool_calls[0]["id"]


def test_bind_tools_required_streamed(chat_openai):
    llm = chat_openai.bind_tools([get_weather], tool_choice="required",
                                 parallel_tool_calls=False)
    merged = None
    for chunk in llm.stream("Weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
    assert isinstance(merged, AIMessageChunk)
    assert [call["name"] for call in merged.tool_calls] == ["get_weather"]
    assert merged.response_metadata["finish_reason"] == "tool_calls"


def test_with_structured_output_json_schema(chat_openai):
    result = chat_openai.with_structured_output(Forecast, method="json_schema").invoke(
        "Forecast for Paris")
    assert isinstance(result, Forecast)


def test_stream_text_and_usage(chat_openai):
    chunks = list(chat_openai.stream("Count to three", max_tokens=6, stream_usage=True))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.usage_metadata["output_tokens"] >= 1
    assert merged.response_metadata["finish_reason"] in ("stop", "length")


async def test_astream(chat_openai):
    text = ""
    async for chunk in chat_openai.astream("Say something", max_tokens=6):
        text += chunk.content
    whole = await chat_openai.ainvoke("Say something", max_tokens=6)
    assert text == whole.content
