"""The server on the real SmolLM2-135M-Instruct (GGUF, CPU, greedy), driven by the official
``openai`` client and ``ChatOpenAI``.

    pytest integration_tests/test_serve_smollm2.py
"""

from __future__ import annotations

import asyncio
import json

import pytest

from langchain_ascend.testing import needs_smollm2

pytestmark = [needs_smollm2(), pytest.mark.slow]

MODEL = "smollm2"
SYSTEM = ("You are a helpful assistant for a travel agency. Answer briefly and politely, "
          "and use the tools when the user asks about the weather. ") * 3
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def base_url():
    from langchain_ascend.chat_models import AscendChatModel
    from langchain_ascend.serve import create_app
    from langchain_ascend.serve.local import serving
    from langchain_ascend.testing.real_model import smollm2_chat_kwargs

    chat = AscendChatModel(**smollm2_chat_kwargs(max_tokens=48))
    chat.warm_up()
    with serving(create_app(chat, served_model_name=MODEL)) as url:
        yield url


def test_answer_and_shared_prefix_cache(base_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"}], max_tokens=24)
    assert first.choices[0].message.content.strip()
    second = OpenAI(base_url=f"{base_url}/v1", api_key="unused").chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": "Name a city in Spain."}],
        max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens >= 64


def test_forced_tool_call_streamed(base_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=64,
        stream=True)
    fragments = [c for chunk in stream if chunk.choices
                 for c in chunk.choices[0].delta.tool_calls or []]
    assert fragments[0].function.name == "get_weather"
    args = json.loads("".join(f.function.arguments or "" for f in fragments))
    assert isinstance(args.get("city"), str)


def test_chat_openai_structured_output_and_concurrency(base_url):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    llm = ChatOpenAI(base_url=f"{base_url}/v1", api_key="unused", model=MODEL,
                     temperature=0, max_tokens=64, max_retries=0)
    city = llm.with_structured_output(City, method="json_schema").invoke(
        "Paris is a city in which country? Answer as JSON.")
    assert isinstance(city, City)

    async def many() -> list:
        return await asyncio.gather(*[llm.ainvoke(f"Say hello number {i}", max_tokens=8)
                                      for i in range(8)])

    replies = asyncio.run(many())
    assert all(r.usage_metadata["output_tokens"] >= 1 for r in replies)
