"""Auth, the bounded queue, client disconnects and the engine's blocks."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from conftest import MODEL
from serve_helpers import serving, wait_until

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.serve import create_app

USER = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def keyed_url(served_chat):
    with serving(create_app(served_chat, served_model_name=MODEL, api_key="s3cret")) as url:
        yield url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "s3cret"},
                                     {"Authorization": "Basic s3cret"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"),
                                         ("POST", "/v1/chat/completions"),
                                         ("POST", "/v1/embeddings")])
def test_v1_routes_need_the_key(keyed_url, headers, method, path):
    response = httpx.request(method, f"{keyed_url}{path}", headers=headers, content=b"{bad",
                             timeout=30)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("value", ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"])
def test_the_scheme_is_case_insensitive(keyed_url, value):
    response = httpx.get(f"{keyed_url}/v1/models", headers={"Authorization": value}, timeout=30)
    assert response.status_code == 200


def test_the_key_opens_the_routes(keyed_url):
    from openai import AuthenticationError, OpenAI

    good = OpenAI(base_url=f"{keyed_url}/v1", api_key="s3cret", max_retries=0)
    reply = good.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    assert reply.usage.completion_tokens >= 1
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{keyed_url}/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(f"{keyed_url}/health", timeout=30).status_code == 200


def test_disconnect_mid_stream_returns_every_block(base_url, engine, server_app):
    idle = engine.stats().num_blocks_used
    body = {"model": MODEL, "messages": USER, "max_tokens": 900, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body,
                      timeout=60) as response:
        lines = response.iter_lines()
        events = [next(lines) for _ in range(8)]
        stats = engine.stats()
        assert stats.num_running == 1 and stats.num_blocks_used > idle
    # closed mid-reply: nothing carried a finish_reason
    assert all('"finish_reason":null' in e or not e.startswith("data: {")
               for e in events if e)
    assert wait_until(lambda: engine.stats().num_blocks_used == idle
                      and engine.stats().num_running == 0)
    assert wait_until(lambda: server_app.server_state.admission.in_flight == 0)


def test_queue_full_is_429_with_retry_after(tiny_qwen2_path):
    # ignore_eos: the held reply runs its whole budget, however the random model samples
    one = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=0,
                          max_tokens=4000, max_batch_size=1, max_context_length=4096,
                          ignore_eos=True)
    app = create_app(one, served_model_name=MODEL, max_waiting=0)
    with serving(app) as url:
        one.warm_up()
        body = {"model": MODEL, "messages": USER, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                          timeout=60) as held:
            lines = held.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # the first is running: the batch of one is full
            assert app.server_state.admission.in_flight == 1
            refused = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False},
                                 timeout=30)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        assert wait_until(lambda: app.server_state.admission.in_flight == 0)
        after = httpx.post(f"{url}/v1/chat/completions",
                           json={"model": MODEL, "messages": USER, "max_tokens": 2}, timeout=60)
        assert after.status_code == 200
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'langchain_ascend_requests_total{endpoint="/v1/chat/completions",status="429"} 1.0' \
            in metrics
    one.get_engine().shutdown()


def test_health_metrics_and_docs(base_url, client):
    client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    health = httpx.get(f"{base_url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    for name in ("langchain_ascend_requests_total", "langchain_ascend_prompt_tokens_total",
                 "langchain_ascend_cached_prompt_tokens_total",
                 "langchain_ascend_generated_tokens_total", "langchain_ascend_requests_running",
                 "langchain_ascend_requests_waiting", "langchain_ascend_kv_blocks_used",
                 "langchain_ascend_time_to_first_token_seconds_bucket",
                 "langchain_ascend_inter_token_seconds_bucket"):
        assert name in text, name
    assert httpx.get(f"{base_url}/docs", timeout=30).status_code == 200
    schema = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    assert "/v1/chat/completions" in schema["paths"]


def test_concurrent_streams_share_the_engine(base_url, engine):
    before = engine.stats().num_steps
    results: list[int] = []

    def one(i: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"story {i}"}],
                "max_tokens": 12, "stream": True}
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body,
                          timeout=120) as response:
            payloads = [line for line in response.iter_lines() if line.startswith("data: ")]
        results.append(sum(1 for p in payloads[:-1]
                           if json.loads(p[6:])["choices"][0]["delta"].get("content")))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 6 and all(n >= 1 for n in results)
    # batched: far fewer engine steps than 6 replies of 12 tokens one after another
    assert engine.stats().num_steps - before < 6 * 12
