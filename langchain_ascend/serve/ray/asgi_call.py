"""Drive an ASGI app in-process for one forwarded HTTP request (no Ray, no web framework).

The front deployment reads a request, picks the replica (by its routing key) and hands the
request's parts to that replica; the replica runs them through its own FastAPI app — the
server's app, unchanged — with :func:`call_asgi`, and streams the response back: first the
start (status and headers), then the body chunks as the app sends them (server-sent events
arrive as they are produced).

If the consumer stops reading (the client went away, or the call was cancelled), the app sees
``http.disconnect`` on its next ``receive()`` — as under uvicorn — so the server aborts the
engine request and returns its KV blocks, and the app's task is cancelled if it does not end
on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ForwardedRequest", "ResponseStart", "call_asgi"]

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                   Awaitable[None]]

_DONE = object()


@dataclass(frozen=True)
class ForwardedRequest:
    """The parts of an HTTP request a replica needs to run it (picklable plain data)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Sequence[tuple[bytes, bytes]] = ()
    body: bytes = b""
    client: tuple[str, int] | None = None

    def scope(self) -> dict[str, Any]:
        """The ASGI HTTP scope of this request."""
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method.upper(),
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode("latin-1", "replace"),
            "root_path": "",
            "query_string": self.query_string,
            "headers": [(bytes(k).lower(), bytes(v)) for k, v in self.headers],
            "client": self.client,
            "server": None,
            "state": {},
        }


@dataclass(frozen=True)
class ResponseStart:
    """The first item of a forwarded response: status and headers."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (case-insensitive), or ``None``."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None


def _receiver(body: bytes, disconnected: asyncio.Event) -> Callable[[], Awaitable[dict]]:
    """``receive()`` for the app: the body once, then ``http.disconnect`` when the caller leaves."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    return receive


async def _run_app(app: ASGIApp, request: ForwardedRequest, disconnected: asyncio.Event,
                   out: asyncio.Queue) -> None:
    """Run ``app`` on ``request``, putting ``ResponseStart`` / body ``bytes`` / errors on ``out``."""

    async def send(message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            await out.put(ResponseStart(int(message["status"]), headers))
        elif kind == "http.response.body":
            chunk = bytes(message.get("body", b""))
            if chunk:
                await out.put(chunk)
            if not message.get("more_body", False):
                await out.put(_DONE)

    try:
        await app(request.scope(), _receiver(request.body, disconnected), send)
    except Exception as error:  # handed to the consumer, which raises it in its own task
        await out.put(error)
    finally:
        await out.put(_DONE)


async def call_asgi(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ResponseStart |
                                                                                bytes]:
    """Run one request through ``app``: yields a :class:`ResponseStart`, then body chunks.

    Raises:
        RuntimeError: The app ended without starting a response.
        Exception: Whatever the app raised (after the response started, too).
    """
    disconnected = asyncio.Event()
    out: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(_run_app(app, request, disconnected, out))
    started = False
    try:
        while True:
            item = await out.get()
            if item is _DONE:
                break
            if isinstance(item, Exception):
                raise item
            if isinstance(item, ResponseStart):
                started = True
            yield item
        if not started:
            raise RuntimeError(f"the app sent no response to {request.method} {request.path}")
    finally:
        disconnected.set()
        if not task.done():
            # The app was told the client left; give it a moment to abort cleanly, then cancel.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
