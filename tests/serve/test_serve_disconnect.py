"""A client that goes away before its reply -- plain, or a stream before its first chunk (a
long prefill, a queue) -- cancels the call, so the engine request is aborted and its slot
freed (a client timeout's retry would otherwise come on top of work nobody reads)."""

from __future__ import annotations

import asyncio
import json

from langchain_core.messages import AIMessage

from langchain_ascend.serve.app import create_app
from langchain_ascend.serve.ray.asgi_call import ForwardedRequest, _receiver


class NeverReplies:
    """A chat model whose ``ainvoke`` waits until it is cancelled (and says so)."""

    model = "never.gguf"
    max_batch_size = 1

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def wait_until_cancelled(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def ainvoke(self, messages, stop=None, **kwargs):
        await self.wait_until_cancelled()
        return AIMessage("unreachable")


class NeverStreams(NeverReplies):
    """A chat model whose ``astream`` waits before its first chunk until it is cancelled."""

    async def astream(self, messages, stop=None, **kwargs):
        await self.wait_until_cancelled()
        yield AIMessage("unreachable")


class Replies(NeverReplies):
    async def ainvoke(self, messages, stop=None, **kwargs):
        return AIMessage("hello", response_metadata={"finish_reason": "stop"})


async def _post(app, body: dict, client_gone: asyncio.Event) -> list[dict]:
    """POST body to /v1/chat/completions over raw ASGI; the channel reports the disconnect
    once ``client_gone`` is set. Returns what the app sent."""
    request = ForwardedRequest("POST", "/v1/chat/completions",
                               headers=[(b"content-type", b"application/json")],
                               body=json.dumps(body).encode(), client=("127.0.0.1", 1))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    # the body once, then http.disconnect when the client is gone (as a Ray replica drives it)
    await app(request.scope(), _receiver(request.body, client_gone), send)
    return sent


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_plain_reply_whose_client_left_is_cancelled_and_frees_its_slot():
    model = NeverReplies()
    app = create_app(model, served_model_name="m", max_waiting=0)

    async def scenario() -> list[dict]:
        gone = asyncio.Event()
        call = asyncio.ensure_future(_post(app, BODY, gone))
        await asyncio.wait_for(model.started.wait(), 10)
        gone.set()  # the client times out
        return await asyncio.wait_for(call, 10)

    sent = asyncio.run(scenario())
    assert model.cancelled
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert app.server_state.admission.in_flight == 0  # the slot is free for the next one


def test_a_client_that_stays_gets_its_reply():
    app = create_app(Replies(), served_model_name="m")

    async def scenario() -> list[dict]:
        return await asyncio.wait_for(_post(app, BODY, asyncio.Event()), 10)

    sent = asyncio.run(scenario())
    assert sent[0]["status"] == 200
    reply = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert reply["choices"][0]["message"]["content"] == "hello"


def test_a_stream_whose_client_left_before_its_first_chunk_is_cancelled():
    model = NeverStreams()
    app = create_app(model, served_model_name="m", max_waiting=0)

    async def scenario() -> list[dict]:
        gone = asyncio.Event()
        call = asyncio.ensure_future(_post(app, {**BODY, "stream": True}, gone))
        await asyncio.wait_for(model.started.wait(), 10)
        gone.set()  # the client gives up during the prefill
        return await asyncio.wait_for(call, 10)

    sent = asyncio.run(scenario())
    assert model.cancelled
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert app.server_state.admission.in_flight == 0
