"""Server-sent events: one ``data:`` line per JSON object, ``data: [DONE]`` at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from langchain_ascend.serve.web import StreamingResponse

DONE = "data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(data: Any, name: str | None = None) -> str:
    """One event holding ``data`` as compact JSON (``event: name`` first when given)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n" if name else f"data: {text}\n\n"


class Release:
    """Runs ``cleanup`` (an async callable) once, however often it is called."""

    def __init__(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        self.cleanup = cleanup
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await self.cleanup()


class EventStream(StreamingResponse):
    """A server-sent-events response that runs ``release`` when it ends in any way: the body
    finished, failed, was cancelled by a client disconnect, or never started (a client gone
    before the first byte), so a stream's resources (the engine request, the admission slot)
    are never left held."""

    def __init__(self, content: AsyncIterator[str], release: Release) -> None:
        super().__init__(content, media_type=MEDIA_TYPE, headers=HEADERS)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()
