"""Server-sent events: one ``data:`` line per JSON object, ``data: [DONE]`` at the end."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(data: Any, name: str | None = None) -> str:
    """One event holding ``data`` as compact JSON (``event: name`` first when given)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n" if name else f"data: {text}\n\n"
