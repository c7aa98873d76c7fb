"""call_asgi: a forwarded request runs through an ASGI app in-process, streamed back."""

from __future__ import annotations

import asyncio
import json

import pytest

from langchain_ascend.serve.ray.asgi_call import ForwardedRequest, ResponseStart, call_asgi

starlette = pytest.importorskip("starlette")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402


def _app(events: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"got": body, "path": request.url.path,
                             "query": request.url.query,
                             "header": request.headers.get("x-test")}, status_code=201)

    async def stream(request: Request) -> StreamingResponse:
        async def chunks():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                events.append("stream closed")
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def boom(request: Request) -> JSONResponse:
        raise KeyError("broken handler")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/stream", stream),
                             Route("/boom", boom)])


async def _collect(app, request):
    items = [item async for item in call_asgi(app, request)]
    return items[0], b"".join(items[1:])


async def test_a_request_comes_back_with_status_headers_and_body():
    request = ForwardedRequest("post", "/echo", b"a=1",
                               [(b"X-Test", b"yes"), (b"content-type", b"application/json")],
                               json.dumps({"k": [1, 2]}).encode())
    start, body = await _collect(_app([]), request)
    assert isinstance(start, ResponseStart)
    assert start.status == 201
    assert start.header("Content-Type") == "application/json"
    assert json.loads(body) == {"got": {"k": [1, 2]}, "path": "/echo", "query": "a=1",
                                "header": "yes"}


async def test_an_unknown_route_is_the_apps_own_404():
    start, _ = await _collect(_app([]), ForwardedRequest("GET", "/nowhere"))
    assert start.status == 404


async def test_a_stream_arrives_chunk_by_chunk_and_closing_early_disconnects_the_app():
    events: list[str] = []
    stream = call_asgi(_app(events), ForwardedRequest("GET", "/stream"))
    start = await anext(stream)
    assert start.header("content-type").startswith("text/event-stream")
    first = [await anext(stream) for _ in range(3)]
    assert b"".join(first).startswith(b"data: 0\n\n")
    await stream.aclose()
    assert events == ["stream closed"]


async def test_a_handler_error_is_the_apps_own_500():
    start, _ = await _collect(_app([]), ForwardedRequest("GET", "/boom"))
    assert start.status == 500


async def test_an_app_error_before_the_response_reaches_the_caller():
    async def broken(scope, receive, send):
        raise KeyError("broken app")

    with pytest.raises(KeyError, match="broken app"):
        await _collect(broken, ForwardedRequest("GET", "/x"))


async def test_an_app_that_never_answers_is_a_clear_error():
    async def silent(scope, receive, send):
        await receive()

    with pytest.raises(RuntimeError, match="no response to GET /x"):
        await _collect(silent, ForwardedRequest("GET", "/x"))
