"""Helpers of the server tests (imported by file name: the tests folder is on ``sys.path``;
the name is unique); the server in a thread is ``langchain_ascend.serve.local.serving``."""

from __future__ import annotations

import time
from typing import Any

from langchain_ascend.serve.local import free_port, serving

__all__ = ["TOOLS", "free_port", "serving", "sse_events", "wait_until"]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}, {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                       "required": ["timezone"]},
    },
}]


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return bool(value)
        time.sleep(0.02)


def sse_events(lines: Any) -> list[str]:
    """The ``data:`` payloads of an SSE body's lines."""
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]
