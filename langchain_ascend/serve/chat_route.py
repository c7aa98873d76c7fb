"""``POST /v1/chat/completions``: one request -> the chat model's ``ainvoke`` / ``astream``
-> OpenAI JSON or server-sent events.

Errors the chat model raises while preparing (bad ``tool_choice``, a prompt over the context)
surface before the response starts, as 400 JSON: a stream is opened only after its first
chunk. A client that goes away mid-stream cancels the task reading ``astream``, which aborts
the engine request and frees its KV blocks; a client of a plain reply that goes away (a client
timeout: its retry would come on top) cancels its ``ainvoke`` the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage

from langchain_ascend.serve.convert import call_kwargs, to_messages
from langchain_ascend.serve.http_errors import error_body, from_typed_error
from langchain_ascend.serve.openai_types import ChatCompletionRequest
from langchain_ascend.serve.responses import ChunkWriter, completion_object
from langchain_ascend.serve.sse import DONE, EventStream, Release, event
from langchain_ascend.serve.state import ServerState
from langchain_ascend.serve.web import FastAPI, JSONResponse, Request, Response

logger = logging.getLogger(__name__)
T = TypeVar("T")
CLIENT_GONE = 499
"""Status of a reply whose client went away first (nobody reads it; nginx's convention)."""


def add_chat_route(app: FastAPI, state: ServerState) -> None:
    """Register ``POST /v1/chat/completions`` on ``app``."""

    @app.post("/v1/chat/completions", tags=["openai"], summary="Chat completion (OpenAI)")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        started = time.perf_counter()
        state.check_chat_model(body.model)
        kwargs = call_kwargs(body, penalties=state.has_penalties)
        messages = to_messages(body.messages)
        stop = kwargs.pop("stop", None)
        state.admission.enter()
        handed_over = False
        try:
            if not body.stream:
                reply = await unless_disconnected(
                    state.chat_model.ainvoke(messages, stop=stop, **kwargs), request)
                if reply is None:
                    return Response(status_code=CLIENT_GONE)
                state.metrics.count_usage(reply.usage_metadata)
                return JSONResponse(completion_object(reply, model=state.served_model_name))
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            stream = await open_stream(state, messages, stop, kwargs, include_usage, started,
                                       request)
            if stream is None:
                return Response(status_code=CLIENT_GONE)
            handed_over = True
            return stream
        finally:
            if not handed_over:
                state.admission.leave()


async def unless_disconnected(work: Awaitable[T], request: Request) -> T | None:
    """``work``'s result, or None once the client has gone (its ASGI channel says
    ``http.disconnect``): ``work`` is then cancelled (cancelling ``ainvoke`` aborts the engine
    request and frees its blocks). The body was read already, so the channel's next message
    is the disconnect, or nothing until the response is sent."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler cancelled (shutdown): so is the work
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # its abort has run
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def open_stream(state: ServerState, messages: list[BaseMessage], stop: Any,
                      kwargs: dict[str, Any], include_usage: bool, started: float,
                      request: Request) -> EventStream | None:
    """Start the reply and wait for its first chunk (errors so far are raised, as JSON);
    the response then owns the stream and the admission slot (released however it ends).
    None when the client went away before the first chunk (a long prefill, a queue): the
    wait is cancelled, which aborts the engine request, as for a plain reply."""
    chunks = state.chat_model.astream(messages, stop=stop, **kwargs)
    try:
        opened = await unless_disconnected(_first_chunk(chunks), request)
    except BaseException:
        await chunks.aclose()
        raise
    if opened is None:
        await chunks.aclose()
        return None
    (first,) = opened
    state.metrics.ttft.observe(time.perf_counter() - started)

    async def cleanup() -> None:
        try:
            await chunks.aclose()
        finally:
            state.admission.leave()

    release = Release(cleanup)
    writer = ChunkWriter(model=state.served_model_name, include_usage=include_usage)
    return EventStream(stream_events(state, chunks, first, writer, release), release)


async def _first_chunk(chunks: AsyncIterator[Any]) -> tuple[Any]:
    """``(first chunk,)``, ``(None,)`` for an empty stream (a tuple: None means gone)."""
    try:
        return (await anext(chunks),)
    except StopAsyncIteration:
        return (None,)


async def stream_events(state: ServerState, chunks: AsyncIterator[Any], first: Any,
                        writer: ChunkWriter, release: Release) -> AsyncIterator[str]:
    """The events of one reply, ``[DONE]`` last; a failure mid-stream is sent as an error
    event. ``release`` (closing the chat model's stream, leaving the admission slot) runs
    as soon as the events end, and again harmlessly when the response ends."""
    last = None
    message = first
    previous = time.perf_counter()
    try:
        while message is not None:
            for chunk in writer.deltas(message):
                yield event(chunk)
            if message.usage_metadata or message.response_metadata.get("finish_reason"):
                last = message
            try:
                message = await anext(chunks)
            except StopAsyncIteration:
                break
            now = time.perf_counter()
            state.metrics.inter_token.observe(now - previous)
            previous = now
        for chunk in writer.finish(last):
            yield event(chunk)
        yield DONE
        state.metrics.count_usage(last.usage_metadata if last is not None else None)
    except Exception as error:  # headers are sent: the error travels as an event
        api_error = from_typed_error(error)
        yield event(error_body(api_error.status, api_error.message, api_error.param,
                               api_error.code))
        yield DONE
    finally:
        await release()
