"""Helpers shared by the NPUStreamToolExecutor tests (tests/tools and tests/executor): call
builders, a concurrency gate that counts how many calls are inside a tool at once, a scripted
chat model and the ``release`` fixture (re-exported by both folders' conftest.py).

Imported by file name: tests/conftest.py puts this folder on ``sys.path``; the name is unique
across the test tree so it cannot shadow another folder's helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage


def tool_call(tool_name: str, call_id: str, /, **args: Any) -> dict[str, Any]:
    """A ToolCall dict as models produce it."""
    return {"name": tool_name, "args": args, "id": call_id, "type": "tool_call"}


def ai(*calls: dict[str, Any]) -> AIMessage:
    """An AIMessage carrying ``calls``."""
    return AIMessage("", tool_calls=list(calls))


class Gate:
    """Counts callers inside at once. Until ``target`` callers have been inside together (or
    ``hold_s`` passed) everyone who enters waits, so calls allowed to overlap do overlap.

    With a correct bound of ``target`` the peak is exactly ``target``; a broken bound lets
    more in while the first ones wait, so the peak goes above it.
    """

    def __init__(self, target: int, hold_s: float = 2.0) -> None:
        self.target = target
        self.hold_s = hold_s
        self.inside = 0
        self.peak = 0
        self.entered = 0
        self._cond = threading.Condition()

    def pass_through(self) -> None:
        with self._cond:
            self.inside += 1
            self.entered += 1
            self.peak = max(self.peak, self.inside)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.peak >= self.target, timeout=self.hold_s)
        time.sleep(0.02)
        with self._cond:
            self.inside -= 1

    async def apass_through(self) -> None:
        with self._cond:
            self.inside += 1
            self.entered += 1
            self.peak = max(self.peak, self.inside)
        deadline = time.monotonic() + self.hold_s
        while time.monotonic() < deadline:
            with self._cond:
                if self.peak >= self.target:
                    break
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.02)
        with self._cond:
            self.inside -= 1


class ScriptedChatModel(FakeMessagesListChatModel):
    """Replays ``responses`` in order; ``bind_tools`` returns the model itself, so agent code
    written for a real model runs unchanged without an LLM."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event hung tools wait on; set at teardown so no thread outlives the test for long."""
    event = threading.Event()
    yield event
    event.set()
