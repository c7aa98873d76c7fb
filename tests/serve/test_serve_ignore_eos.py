"""vLLM's ``ignore_eos`` extra parameter: replies of exactly ``max_tokens`` (benchmarks)."""

from __future__ import annotations

from conftest import MODEL

from langchain_ascend.serve.convert import call_kwargs
from langchain_ascend.serve.openai_types import ChatCompletionRequest

USER = [{"role": "user", "content": "Say one word."}]


def test_ignore_eos_reaches_the_chat_model_call():
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": USER, "ignore_eos": True})
    assert call_kwargs(request)["ignore_eos"] is True
    plain = ChatCompletionRequest.model_validate({"model": MODEL, "messages": USER})
    assert "ignore_eos" not in call_kwargs(plain)


def test_ignore_eos_replies_are_max_tokens_long(client):
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=40,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 40
    assert reply.choices[0].finish_reason == "length"
