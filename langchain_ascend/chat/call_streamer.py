"""Stream one JSON tool call's name and argument text as the model writes it. Pure.

Hermes (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and Llama-3 JSON
(``{"name": ..., "parameters": {...}}``) calls start with the tool's name and then the
argument object, so both can be handed over before the call ends: a first
``tool_call_chunk`` with index, id and name (``args=""``) as soon as the name is read, then
the argument object's text as it arrives. A small JSON scanner follows the argument object so
that exactly its text is sent, up to and including its own closing brace; nothing of the
call's own closing (outer ``}``, end marker) ever is. Raw control characters inside strings
are sent escaped, so the concatenated text is strict JSON whose parse equals the arguments.

When the finished call turns out invalid (cut at ``max_tokens``, bad JSON after the
arguments) or different from what was streamed, :meth:`CallStreamer.terminator` gives one
last fragment that makes the concatenation unparseable (a mismatched bracket), so LangChain's
chunk merge ends with an ``InvalidToolCall``, as the whole-call path gives. Calls of other
shapes (Mistral, OpenAI-shaped ``{"function": ...}``, ``"arguments"`` before ``"name"``) get
no fragments here and are released whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Any

from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGS_START = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(\S)')
_CLOSERS = {"{": "}", "[": "]"}


def cut_argument_text(call_text: str) -> str | None:
    """What the stream of a call cut short, written as ``call_text`` (one call: its opening
    marker, if any, then its JSON), sends as arguments: the argument text the model wrote,
    then :meth:`CallStreamer.terminator`, so they never parse. None where such a call is
    not streamed (another shape, several calls, no name yet, arguments not an object)."""
    start = call_text.find("{")
    if start < 0 or "[" in call_text[:start]:  # a list of calls (Mistral's [TOOL_CALLS] [...])
        return None
    streamer = CallStreamer(0, lambda: "")
    body = call_text[start:]
    streamer.update(body)  # the opening
    streamer.update(body)  # the arguments
    if not (streamer.started and streamer.args):
        return None
    return streamer.args + (streamer.terminator()["args"] or "")


class CallStreamer:
    """Fragments of one call, from the growing text of its JSON body.

    Args:
        index: The call's position among the message's calls.
        id_factory: Makes the call's id when its name is read.
        names: Names a call may have to be streamed (``None``: any).
    """

    def __init__(self, index: int, id_factory: Callable[[], str],
                 names: Collection[str] | None = None) -> None:
        self.index = index
        self.id: str | None = None
        self.name: str | None = None
        self.args = ""  # argument text sent so far
        self.closed = False  # the argument object's closing brace was sent
        self._id_factory = id_factory
        self._names = names
        self.opening: ToolCallChunk | None = None
        self._pos: int | None = None  # where scanning of the argument text continues
        self._stack: list[str] = []
        self._in_string = False
        self._escaped = False

    @property
    def started(self) -> bool:
        """The opening fragment (index, id, name) went out."""
        return self.id is not None

    def update(self, body: str) -> list[ToolCallChunk]:
        """New fragments for ``body``, the call's text so far (it only ever grows)."""
        out: list[ToolCallChunk] = []
        if self.id is None:
            self._read_name(body, out)
            return out  # the opening goes alone: the argument text starts with the next update
        if self._pos is None:
            head = _HEAD.match(body)
            assert head is not None
            start = _ARGS_START.match(body, head.end())
            if start is None or start.group(1) != "{":
                return out  # not yet, or not an object: the arguments go out whole
            self._pos = start.start(1)
        if not self.closed:
            text = self._scan(body)
            if text:
                self.args += text
                out.append(self._fragment(text))
        return out

    def matches(self, name: str | None, args: dict[str, Any] | None) -> bool:
        """Whether the sent argument text (if any) is that of the finished call."""
        if name != self.name or args is None:
            return False
        if not self.args:
            return True
        if not self.closed:
            return False
        try:
            return bool(json.loads(self.args) == args)
        except json.JSONDecodeError:
            return False

    def rest(self, args: dict[str, Any]) -> list[ToolCallChunk]:
        """What a matching finished call still has to send: its arguments when none went."""
        return [] if self.args else [self._fragment(json.dumps(args, ensure_ascii=False))]

    def terminator(self) -> ToolCallChunk:
        """The last fragment of a call that ended invalid: it closes any open string, then a
        bracket that closes nothing open, so the merged text never parses as arguments."""
        text = ('n"' if self._escaped else '"') if self._in_string else ""
        text += "}" if self._stack and self._stack[-1] == "]" else "]"
        return self._fragment(text)

    # -- internals ---------------------------------------------------------------------------

    def _read_name(self, body: str, out: list[ToolCallChunk]) -> None:
        head = _HEAD.match(body)
        if head is None:
            return
        name = json.loads(head.group(1), strict=False)
        if not isinstance(name, str) or not name or (
                self._names is not None and name not in self._names):
            return
        self.name, self.id = name, self._id_factory()
        self.opening = tool_call_chunk(name=name, args="", id=self.id, index=self.index)
        out.append(self.opening)

    def _scan(self, body: str) -> str:
        """The argument text from the scan position to the end of ``body`` or the object's
        closing brace, whichever comes first (advances the scan position)."""
        assert self._pos is not None
        sent: list[str] = []
        pos = self._pos
        while pos < len(body) and not self.closed:
            char = body[pos]
            pos += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                elif ord(char) < 0x20:
                    char = f"\\u{ord(char):04x}"
            elif char == '"':
                self._in_string = True
            elif char in _CLOSERS:
                self._stack.append(_CLOSERS[char])
            elif char in "}]":
                if self._stack and self._stack[-1] == char:
                    self._stack.pop()
                self.closed = not self._stack
            sent.append(char)
        self._pos = pos
        return "".join(sent)

    def _fragment(self, args: str) -> ToolCallChunk:
        return tool_call_chunk(name=None, args=args, id=None, index=self.index)
