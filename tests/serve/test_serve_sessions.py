"""``prompt_cache_key`` / ``prompt_cache_retention`` through the official ``openai`` client:
a hop ending in tool calls parks its session, the next hop resumes on its blocks, /metrics
shows it; Anthropic-style ``cache_control.ttl`` maps; bad retentions are 400s."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import MODEL
from serve_helpers import TOOLS

SYSTEM = {"role": "system", "content": "You are a forecaster. " * 30}
USER = {"role": "user", "content": "Weather in Oslo?"}


def test_prompt_cache_key_parks_and_resumes_the_session(client, engine, base_url):
    before = engine.stats()
    first = client.chat.completions.create(
        model=MODEL, messages=[SYSTEM, USER], tools=TOOLS, tool_choice="required",
        max_tokens=48, prompt_cache_key="agent-42", prompt_cache_retention="in_memory")
    (call,) = first.choices[0].message.tool_calls[:1]
    parked = engine.stats()
    # parked (a background prefill of the parked session re-parks it: +2 when it already ran)
    assert parked.num_sessions_parked >= before.num_sessions_parked + 1
    assert parked.num_retained_sessions >= 1
    assert "langchain_ascend_retained_sessions" in httpx.get(f"{base_url}/metrics").text
    history = [SYSTEM, USER, first.choices[0].message.model_dump(exclude_none=True),
               *({"role": "tool", "tool_call_id": c.id, "content": "sunny, 21 C"}
                 for c in first.choices[0].message.tool_calls)]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8,
        prompt_cache_key="agent-42")
    after = engine.stats()
    assert after.num_resumed == before.num_resumed + 1
    assert after.num_resume_hits == before.num_resume_hits + 1
    assert second.usage.prompt_tokens_details.cached_tokens >= 64
    assert call.function.name in {"get_weather", "get_time"}
    metrics = httpx.get(f"{base_url}/metrics").text
    assert f"langchain_ascend_session_resume_hits {float(after.num_resume_hits)}" in metrics


def test_cache_control_ttl_maps_and_bad_retention_is_a_400(client, engine):
    content = [{"type": "text", "text": "Weather in Rome?",
                "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    reply = client.chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": content}], tools=TOOLS,
        tool_choice="required", max_tokens=48, prompt_cache_key="agent-43")
    assert reply.choices[0].message.tool_calls
    assert engine.stats().num_retained_sessions >= 1
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2,
                                       prompt_cache_key="agent-44",
                                       prompt_cache_retention="forever")
    assert "retention" in str(caught.value)
