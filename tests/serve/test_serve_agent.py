"""``POST /v1/agent``: the agent of an agent config whose tools are named by import path."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import MODEL
from serve_helpers import serving, sse_events

from langchain_ascend.config import load_agent_config
from langchain_ascend.serve import create_app


@pytest.fixture(scope="module")
def agent_url(tiny_qwen2_path):
    parts = load_agent_config({
        "npu": {"device": "cpu"},
        "model": {"path": str(tiny_qwen2_path), "max_tokens": 48, "temperature": 0,
                  "max_context_length": 1024, "budget_closed_output": "complete"},
        "tools": {"imports": ["serve_tools:get_weather", "serve_tools.get_time"]},
        "agent": {"max_hops": 2, "first_hop_tool_choice": "required",
                  "final_hop_tool_choice": "none"},
    })
    assert [t.name for t in parts.tools] == ["get_weather", "get_time"]
    app = create_app(parts.chat_model, served_model_name=MODEL, agent=parts.agent)
    with serving(app) as url:
        yield url


QUESTION = {"messages": [{"role": "user", "content": "Weather in Paris?"}]}


def test_agent_json_answer_hops_and_calls(agent_url):
    response = httpx.post(f"{agent_url}/v1/agent", json=QUESTION, timeout=120)
    assert response.status_code == 200, response.text
    run = response.json()
    assert run["hops"] == 2
    assert [call["function"]["name"] for call in run["tool_calls"]] in (["get_weather"],
                                                                         ["get_time"])
    assert run["tool_calls"][0]["hop"] == 1
    roles = [m["role"] for m in run["messages"]]
    assert roles == ["assistant", "tool", "assistant"]
    assert run["answer"] == run["messages"][-1]["content"]


def test_agent_events_stream(agent_url):
    with httpx.stream("POST", f"{agent_url}/v1/agent", json={**QUESTION, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        payloads = sse_events(response.iter_lines())
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    kinds = [e["kind"] for e in events]
    assert kinds.index("message") < kinds.index("tool_result") < kinds.index("final")
    assert kinds[-1] == "final" and events[-1]["run"]["hops"] == 2
    assert {e["hop"] for e in events} == {1, 2}


def test_agent_bad_input(agent_url):
    response = httpx.post(f"{agent_url}/v1/agent", json={"messages": []}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    response = httpx.post(f"{agent_url}/v1/agent", json={**QUESTION, "model": "x"}, timeout=30)
    assert response.status_code == 404
