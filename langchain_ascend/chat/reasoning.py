"""Split a reasoning model's ``<think>...</think>`` section from its answer, as text streams.

Pure Python. Qwen3, DeepSeek-R1 distills and QwQ write their reasoning first, between
``<think>`` and ``</think>``; some chat templates open the ``<think>`` in the prompt, so the
reply starts inside the reasoning and only the closing tag appears. The answer after the
closing tag is what tool-call parsing and the message content see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open ``<think>`` block."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


@dataclass
class ReasoningDelta:
    """New reasoning text and new answer text from one :meth:`ReasoningSplitter.feed`."""

    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Incrementally route text to ``reasoning`` or ``content``.

    Only a ``<think>`` at the very start of the reply (after whitespace) opens reasoning;
    anything else makes the whole reply content. Whitespace right inside the tags and right
    after ``</think>`` is dropped. A reply cut off inside the reasoning has no content.

    Args:
        start_in_reasoning: The prompt already opened ``<think>``.
        enabled: When False everything is content (a pass-through).
    """

    def __init__(self, *, start_in_reasoning: bool = False, enabled: bool = True) -> None:
        self._state: Literal["start", "reasoning", "content"] = (
            "content" if not enabled else ("reasoning" if start_in_reasoning else "start")
        )
        self._buf = ""
        self._held_ws = ""
        self._reasoning_started = False
        self._strip_content_ws = False

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed(self, text: str) -> ReasoningDelta:
        """Consume the next piece of reply text."""
        self._buf += text
        delta = ReasoningDelta()
        while True:
            if self._state == "content":
                self._emit_content(delta, self._buf)
                self._buf = ""
                return delta
            if self._state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._buf = stripped[len(THINK_OPEN) :]
                    self._state = "reasoning"
                    continue
                if THINK_OPEN.startswith(stripped):
                    return delta  # empty or a partial "<think": wait
                self._state = "content"
                continue
            end = self._buf.find(THINK_CLOSE)
            if end < 0:
                keep = _partial_suffix(self._buf, THINK_CLOSE)
                self._emit_reasoning(delta, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return delta
            self._emit_reasoning(delta, self._buf[:end])
            self._held_ws = ""
            self._buf = self._buf[end + len(THINK_CLOSE) :]
            self._state = "content"
            self._strip_content_ws = True

    def finish(self) -> ReasoningDelta:
        """Flush what is held back at the end of the reply."""
        delta = ReasoningDelta()
        if self._state == "reasoning":
            self._emit_reasoning(delta, self._buf)
        else:
            self._emit_content(delta, self._buf)
        self._buf = ""
        return delta

    def _emit_reasoning(self, delta: ReasoningDelta, text: str) -> None:
        if not self._reasoning_started:
            text = text.lstrip()
            if not text:
                return
            self._reasoning_started = True
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        delta.reasoning += body

    def _emit_content(self, delta: ReasoningDelta, text: str) -> None:
        if self._strip_content_ws:
            text = text.lstrip()
            if not text:
                return
            self._strip_content_ws = False
        delta.content += text


def _partial_suffix(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def split_reasoning(
    text: str, *, start_in_reasoning: bool = False, enabled: bool = True
) -> tuple[str, str]:
    """Split a complete reply into ``(reasoning, content)``."""
    splitter = ReasoningSplitter(start_in_reasoning=start_in_reasoning, enabled=enabled)
    first = splitter.feed(text)
    last = splitter.finish()
    return first.reasoning + last.reasoning, first.content + last.content
