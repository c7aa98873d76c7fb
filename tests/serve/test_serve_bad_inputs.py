"""Every bad input gets a 4xx with OpenAI's error object naming the field; the server keeps
serving afterwards."""

from __future__ import annotations

import httpx
import pytest
from conftest import MODEL
from serve_helpers import TOOLS

USER = [{"role": "user", "content": "hi"}]


def ask(**fields):
    return {"model": MODEL, "messages": USER, "max_tokens": 2, **fields}


ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                       "arguments": '{"city": "Paris"}'}}]}

CASES = {
    "wrong type": (ask(temperature="hot"), 400, "temperature"),
    "bool count": (ask(max_tokens=True), 400, "max_tokens"),
    "zero max_tokens": (ask(max_tokens=0), 400, "max_tokens"),
    "max_completion_tokens range": (ask(max_completion_tokens=-1), 400,
                                    "max_completion_tokens"),
    "temperature range": (ask(temperature=3), 400, "temperature"),
    "top_p zero": (ask(top_p=0), 400, "top_p"),
    "negative seed": (ask(seed=-1), 400, "seed"),
    "n > 1": (ask(n=2), 400, "n"),
    "unsupported parameter": (ask(best_of=3), 400, "best_of"),
    "logprobs": (ask(logprobs=True), 400, "logprobs"),
    "logit_bias": (ask(logit_bias={"1": 5}), 400, "logit_bias"),
    "stream_options without stream": (ask(stream_options={"include_usage": True}), 400,
                                      "stream_options"),
    "no messages": (ask(messages=[]), 400, "messages"),
    "unknown role": (ask(messages=[{"role": "wizard", "content": "hi"}]), 400,
                     "messages[0].role"),
    "image content": (ask(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400,
        "messages[0].content"),
    "tool_choice names no tool": (ask(tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "nope"}}), 400, "tool_choice.function.name"),
    "tool_choice spelling": (ask(tools=TOOLS, tool_choice="always"), 400, "tool_choice"),
    "required without tools": (ask(tool_choice="required"), 400, "tool_choice"),
    "bad tool name": (ask(tools=[{"type": "function", "function": {"name": "a b"}}]), 400,
                      "tools[0].function.name"),
    "tool without id": (ask(messages=USER + [ASSISTANT_CALL, {"role": "tool",
                                                              "content": "x"}]),
                        400, "messages[2].tool_call_id"),
    "tool answering nothing": (ask(messages=USER + [{"role": "tool", "content": "x",
                                                     "tool_call_id": "call_9"}]),
                               400, "messages[1].tool_call_id"),
    "arguments not JSON": (ask(messages=USER + [{**ASSISTANT_CALL, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]),
        400, "messages[1].tool_calls[0].function.arguments"),
    "json_schema without schema": (ask(response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x"}}),
                                   400, "response_format.json_schema"),
    "response_format type": (ask(response_format={"type": "xml"}), 400,
                             "response_format.type"),
    "empty stop": (ask(stop=[""]), 400, "stop"),
    "prompt over the context": (ask(messages=[{"role": "user", "content": "word " * 3000}]),
                                400, "messages"),
    "max_tokens past the context": (ask(max_tokens=1020), 400, "max_tokens"),
    "max_completion_tokens past the context": (ask(max_completion_tokens=1020), 400,
                                               "max_tokens"),
    "unknown model": (ask(model="gpt-4o"), 404, "model"),
}


@pytest.mark.parametrize("body,status,param", CASES.values(), ids=CASES.keys())
def test_bad_chat_request(base_url, body, status, param):
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and error["type"]


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b""])
def test_malformed_json_is_400(base_url, content):
    response = httpx.post(f"{base_url}/v1/chat/completions", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in ("invalid_json", "invalid_value")


def test_streamed_request_errors_before_the_stream(base_url):
    body = ask(stream=True, messages=[{"role": "user", "content": "word " * 3000}])
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_max_tokens_that_fits_beside_the_prompt_is_served_and_one_more_is_not(base_url):
    """The context (1,024) holds the prompt and exactly the rest: served in full; one more
    token is a 400 naming both, as OpenAI answers (never a reply silently capped)."""
    url = f"{base_url}/v1/chat/completions"
    prompt = httpx.post(url, json=ask(max_tokens=1), timeout=60).json()["usage"]["prompt_tokens"]
    room = 1024 - prompt
    response = httpx.post(url, json=ask(max_tokens=room, ignore_eos=True), timeout=300)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == room
    refused = httpx.post(url, json=ask(max_tokens=room + 1), timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert f"leaves {room}" in refused.json()["error"]["message"]


def test_body_over_the_limit_is_413(base_url):
    body = ask(messages=[{"role": "user", "content": "x" * (2 * 1024 * 1024)}])
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("body,status,param", [
    ({"model": "minilm", "input": []}, 400, "input"),
    ({"model": "minilm", "input": 5}, 400, "input"),
    ({"model": "other", "input": "x"}, 404, "model"),
    ({"model": "minilm", "input": "x", "dimensions": 7}, 400, "dimensions"),
])
def test_bad_embeddings_request(base_url, body, status, param):
    response = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("given, said", [
    ([[15339, 1917]], "token ids"), ([15339, 1917], "token ids"), ("", "empty string"),
    (["a", ""], "input[1] is an empty string")])
def test_embeddings_of_token_ids_or_nothing_say_what_to_send(base_url, given, said):
    response = httpx.post(f"{base_url}/v1/embeddings", json={"model": "minilm", "input": given},
                          timeout=60)
    assert response.status_code == 400 and said in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "input"


def test_embedding_usage_counts_the_tokens_embedded(base_url):
    """A text past the model's 256 word pieces is cut; usage counts what was embedded."""
    def usage(text: str) -> int:
        body = {"model": "minilm", "input": [text]}
        reply = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=60).json()
        return reply["usage"]["prompt_tokens"]

    assert usage("word " * 2000) == usage("word " * 1000) == 256
    assert usage("two words") < 256


def test_agent_route_without_config_is_404(base_url):
    response = httpx.post(f"{base_url}/v1/agent", json={"messages": USER}, timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "agent_not_configured"


def test_still_serving_after_the_bad_inputs(client):
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    assert reply.usage.completion_tokens >= 1
