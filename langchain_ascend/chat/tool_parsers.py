"""Split a model's raw text into content and LangChain tool calls, as it streams. Pure.

The formats themselves (markers, per-format parsing, grammars) are the objects of
:mod:`langchain_ascend.tool_formats`; this module walks the reply, finds their markers and
hands each call's text to its format:

* ``hermes``: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks;
* ``llama3_json``: ``{"name": ..., "parameters": {...}}`` (bare, or after ``<|python_tag|>``);
* ``mistral``: ``[TOOL_CALLS]`` then a JSON list, or v11's ``name[ARGS]{...}``;
* ``auto``: all of these by their markers; bare JSON is a call only with ``name`` and
  ``arguments``/``parameters`` (naming a bound tool, when the names are known).

Hermes and Llama-3 JSON calls stream: their name, then their argument text, as fragments
(:mod:`~langchain_ascend.chat.call_streamer`); Mistral and other shapes come whole.
One streaming parser (:class:`ToolCallStreamParser`) serves the streamed and the one-shot path
(:func:`parse_tool_calls` feeds it the whole text), so ``invoke`` and ``stream`` agree. Text
outside calls stays content (whitespace touching a call trimmed); a malformed call never raises
but becomes an ``InvalidToolCall`` with the raw text and the error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages.tool import (
    InvalidToolCall,
    ToolCall,
    ToolCallChunk,
    invalid_tool_call,
    tool_call,
    tool_call_chunk,
)

from langchain_ascend.chat.call_ids import new_tool_call_id
from langchain_ascend.chat.call_streamer import CallStreamer
from langchain_ascend.tool_formats import (
    LLAMA3_JSON,
    TOOL_CALL_FORMATS,
    TOOL_CALL_MARKERS,
    RawCall,
    ToolCallFormat,
    ToolFormat,
    call_openers,
    detect_tool_call_format,
    formats_for,
    markers_of,
)
from langchain_ascend.tool_formats.hermes import TOOL_CALL_CLOSE as HERMES_CLOSE
from langchain_ascend.tool_formats.hermes import TOOL_CALL_OPEN as HERMES_OPEN
from langchain_ascend.tool_formats.hermes import parse_block as parse_hermes_block
from langchain_ascend.tool_formats.llama3 import PYTHON_TAG
from langchain_ascend.tool_formats.llama3 import parse_payload as parse_llama_payload
from langchain_ascend.tool_formats.mistral import MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_MARKER
from langchain_ascend.tool_formats.mistral import parse_payload as parse_mistral_payload

STREAMED_FORMATS = ("hermes", "llama3_json")
"""Formats whose calls stream as fragments (name first, then the argument text)."""

__all__ = [
    "HERMES_CLOSE",
    "HERMES_OPEN",
    "MISTRAL_ARGS",
    "MISTRAL_CALL_ID",
    "MISTRAL_MARKER",
    "PYTHON_TAG",
    "TOOL_CALL_FORMATS",
    "TOOL_CALL_MARKERS",
    "ExtractedCall",
    "ParsedToolCalls",
    "ParserDelta",
    "ToolCallFormat",
    "ToolCallStreamParser",
    "call_openers",
    "detect_tool_call_format",
    "markers_of",
    "new_tool_call_id",
    "parse_hermes_block",
    "parse_llama_payload",
    "parse_mistral_payload",
    "parse_tool_calls",
]


@dataclass(frozen=True)
class ExtractedCall:
    """One call found in the model's text, valid or not.

    Attributes:
        index: Position among the calls of the message (0-based).
        id: The model's id if it gave one, else a generated one.
        name: Tool name (``None`` when it could not be read).
        args: Parsed arguments; ``None`` when the call is invalid.
        raw: The call exactly as the model wrote it (markers included).
        error: Why the call is invalid; ``None`` for a valid call.
    """

    index: int
    id: str
    name: str | None
    args: dict[str, Any] | None
    raw: str
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None and self.args is not None and bool(self.name)

    def to_tool_call(self) -> ToolCall:
        return tool_call(name=self.name or "", args=self.args or {}, id=self.id)

    def to_invalid_tool_call(self) -> InvalidToolCall:
        return invalid_tool_call(name=self.name, args=self.raw, id=self.id, error=self.error)

    def to_chunk(self) -> ToolCallChunk:
        """The call as a streamed chunk; an invalid call's ``args`` is its raw text."""
        if self.valid:
            args = json.dumps(self.args, ensure_ascii=False)
        else:
            args = self.raw
        return tool_call_chunk(name=self.name, args=args, id=self.id, index=self.index)


@dataclass
class ParsedToolCalls:
    """The result of parsing one complete model reply."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    calls: list[ExtractedCall] = field(default_factory=list)


@dataclass
class ParserDelta:
    """What one :meth:`ToolCallStreamParser.feed` produced: new content, finished calls and
    the tool-call chunks to stream (fragments of calls under way, whole calls)."""

    content: str = ""
    calls: list[ExtractedCall] = field(default_factory=list)
    chunks: list[ToolCallChunk] = field(default_factory=list)


class ToolCallStreamParser:
    """Split streamed model text into content and tool calls as it arrives.

    Content is released as soon as it cannot be the start of a call marker; a call of a format
    with a closing marker (Hermes) is released when that marker arrives; Mistral, Llama and
    bare-JSON calls run to the end of the reply and are released by :meth:`finish`. Each
    call's text is parsed by its :class:`~langchain_ascend.tool_formats.format_base.ToolFormat`.

    Args:
        fmt: Which format(s) to recognise.
        tool_names: Names of the bound tools; a bare JSON reply is only taken as a call when
            it names one of them.
        allow_bare_json: Whether a reply that is just a JSON object may be a Llama-style call
            (defaults to True for ``llama3_json`` and ``auto``).
        id_factory: Makes ids for calls the model gave none.
    """

    def __init__(
        self,
        fmt: ToolCallFormat = "auto",
        *,
        tool_names: Collection[str] | None = None,
        allow_bare_json: bool | None = None,
        id_factory: Callable[[], str] = new_tool_call_id,
    ) -> None:
        if fmt not in TOOL_CALL_FORMATS:
            raise ValueError(f"unknown tool call format {fmt!r}; expected one of {TOOL_CALL_FORMATS}")
        self._formats = formats_for(fmt)
        self._markers = tuple(f.opener for f in self._formats)
        self._tool_names = set(tool_names) if tool_names is not None else None
        bare = any(f.bare_json for f in self._formats)
        self._allow_bare = bare if allow_bare_json is None else allow_bare_json
        self._id_factory = id_factory
        self._buf = ""
        # "block": inside a call that ends at its format's closer; "tail": a call that runs to
        # the end of the reply (format None: a bare JSON reply, maybe content after all).
        self._mode: Literal["text", "block", "tail"] = "text"
        self._format: ToolFormat | None = None
        self._seen_content = False
        self._after_call = False
        self._held_ws = ""
        self._num_calls = 0
        self._finished = False
        self._streamer: CallStreamer | None = None

    @property
    def num_calls(self) -> int:
        """Calls released so far."""
        return self._num_calls

    def feed(self, text: str) -> ParserDelta:
        """Consume the next piece of model text."""
        if self._finished:
            raise RuntimeError("ToolCallStreamParser.feed() after finish()")
        self._buf += text
        delta = ParserDelta()
        self._advance(delta)
        return delta

    def finish(self) -> ParserDelta:
        """Flush everything held back at the end of the reply."""
        delta = ParserDelta()
        if self._finished:
            return delta
        self._finished = True
        if self._mode == "block":
            assert self._format is not None
            self._stream(delta, self._buf)
            self._release(delta, self._format.parse(self._buf, terminated=False)[0])
        elif self._mode == "tail":
            self._finish_tail(delta)
        else:
            self._emit_content(delta, self._buf)
        self._buf = ""
        if self._held_ws and not self._after_call:
            delta.content += self._held_ws
        self._held_ws = ""
        return delta

    # -- internals ---------------------------------------------------------------------------

    def _advance(self, delta: ParserDelta) -> None:
        while True:
            if self._mode == "block":
                assert self._format is not None and self._format.closer is not None
                end = self._buf.find(self._format.closer)
                held = self._partial_marker_suffix((self._format.closer,))
                if end < 0 or self._streamer is not None:  # a call that came whole goes whole
                    self._stream(delta, self._buf[:end] if end >= 0 else self._buf[:len(self._buf) - held])
                if end < 0:
                    return
                body = self._buf[:end]
                self._buf = self._buf[end + len(self._format.closer) :]
                self._release(delta, self._format.parse(body)[0])
                self._mode = "text"
                continue
            if self._mode == "tail":
                self._stream(delta, self._buf)
                return
            if self._bare_json_possible():
                stripped = self._buf.lstrip()
                if not stripped:
                    return  # only whitespace so far: wait
                if stripped.startswith("{"):
                    self._mode, self._format = "tail", None
                    continue
            start, marker = self._find_marker()
            if marker is None:
                keep = self._partial_marker_suffix(self._markers)
                self._emit_content(delta, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return
            self._emit_content(delta, self._buf[:start])
            self._held_ws = ""
            self._buf = self._buf[start + len(marker) :]
            self._format = self._formats[self._markers.index(marker)]
            self._mode = "tail" if self._format.closer is None else "block"

    def _bare_json_possible(self) -> bool:
        return self._allow_bare and not self._seen_content and self._num_calls == 0

    def _find_marker(self) -> tuple[int, str | None]:
        best, found = len(self._buf) + 1, None
        for marker in self._markers:
            pos = self._buf.find(marker)
            if 0 <= pos < best:
                best, found = pos, marker
        return best, found

    def _partial_marker_suffix(self, markers: tuple[str, ...]) -> int:
        """Length of the longest tail of the buffer that could begin one of ``markers``."""
        longest = 0
        for marker in markers:
            for size in range(min(len(marker) - 1, len(self._buf)), longest, -1):
                if self._buf.endswith(marker[:size]):
                    longest = size
                    break
        return longest

    def _emit_content(self, delta: ParserDelta, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        if not text:
            return
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        if body:
            delta.content += body
            self._seen_content = True

    def _stream(self, delta: ParserDelta, body: str) -> None:
        """Fragments of the call under way (Hermes, Llama-3 JSON, bare JSON calls)."""
        if self._streamer is None:
            if self._format is not None and self._format.name not in STREAMED_FORMATS:
                return
            names = self._tool_names if self._format is None else None
            self._streamer = CallStreamer(self._num_calls, self._id_factory, names)
        delta.chunks += self._streamer.update(body)

    def _release(self, delta: ParserDelta, raw_calls: list[RawCall]) -> None:
        streamer, self._streamer = self._streamer, None
        if streamer is not None and streamer.started and not raw_calls:
            raw_calls = [RawCall(streamer.name, None, "", error="the tool call has no JSON")]
        for n, raw in enumerate(raw_calls):
            error = raw.error
            if error is None and (raw.args is None or not raw.name):
                error = "tool call has no name or arguments"
            if n == 0 and streamer is not None and streamer.started:
                call = _settle(delta, streamer, raw, error)
            else:
                call = ExtractedCall(
                    index=self._num_calls,
                    id=raw.id or self._id_factory(),
                    name=raw.name,
                    args=raw.args if error is None else None,
                    raw=raw.raw,
                    error=error,
                )
                delta.chunks.append(call.to_chunk())
            delta.calls.append(call)
            self._num_calls += 1
        self._after_call = True

    def _finish_tail(self, delta: ParserDelta) -> None:
        text = self._buf
        self._stream(delta, text)
        if self._format is not None:
            calls, trailing = self._format.parse(text)
            self._release(delta, calls)
            self._emit_content(delta, trailing)
            return
        bare = next((f for f in self._formats if f.bare_json), LLAMA3_JSON)
        found = bare.parse_bare(text)
        if found is not None and self._tool_names is not None:
            if any(c.name is not None and c.name not in self._tool_names for c in found):
                found = None
        if found is None and self._streamer is not None and self._streamer.started:
            found = [RawCall(self._streamer.name, None, text,
                             error="the reply is not (only) tool calls after all")]
        if found is None:  # a bare JSON reply that is content after all
            self._held_ws = ""
            self._emit_content(delta, text)
            return
        self._release(delta, found)


def _settle(delta: ParserDelta, streamer: CallStreamer, raw: RawCall,
            error: str | None) -> ExtractedCall:
    """The finished form of a streamed call: what it still has to send (its arguments when
    none went; a terminator when it ended invalid or unlike what was sent), and the call.
    A call whose opening is still in this delta goes whole instead (nothing of it went out)."""
    assert streamer.id is not None
    if any(chunk is streamer.opening for chunk in delta.chunks):
        delta.chunks[:] = [c for c in delta.chunks if c["index"] != streamer.index]
        valid = error is None and raw.args is not None and bool(raw.name)
        call = ExtractedCall(streamer.index, streamer.id, raw.name or streamer.name,
                             raw.args if valid else None, raw.raw, error)
        delta.chunks.append(call.to_chunk())
        return call
    if error is None and raw.args is not None and streamer.matches(raw.name, raw.args):
        delta.chunks += streamer.rest(raw.args)
        return ExtractedCall(streamer.index, streamer.id, raw.name, raw.args, raw.raw)
    delta.chunks.append(streamer.terminator())
    return ExtractedCall(
        streamer.index, streamer.id, raw.name or streamer.name, None, raw.raw,
        error or "the finished tool call differs from its streamed name or arguments",
    )


def parse_tool_calls(
    text: str,
    fmt: ToolCallFormat = "auto",
    *,
    tool_names: Collection[str] | None = None,
    allow_bare_json: bool | None = None,
    id_factory: Callable[[], str] = new_tool_call_id,
) -> ParsedToolCalls:
    """Parse one complete model reply into content, tool calls and invalid tool calls.

    Args:
        text: The decoded reply.
        fmt: Format(s) to recognise (see the module docstring).
        tool_names: Names of the bound tools (used to accept a bare JSON reply as a call).
        allow_bare_json: See :class:`ToolCallStreamParser`.
        id_factory: Makes ids for calls the model gave none.

    Returns:
        The content outside the calls and the calls in order; never raises on bad calls.

    Example:
        >>> out = parse_tool_calls('Sure.\\n<tool_call>\\n{"name": "add", "arguments": '
        ...                        '{"a": 1}}\\n</tool_call>', "hermes")
        >>> out.content, out.tool_calls[0]["name"], out.tool_calls[0]["args"]
        ('Sure.', 'add', {'a': 1})
    """
    parser = ToolCallStreamParser(
        fmt, tool_names=tool_names, allow_bare_json=allow_bare_json, id_factory=id_factory
    )
    first = parser.feed(text)
    last = parser.finish()
    calls = first.calls + last.calls
    return ParsedToolCalls(
        content=first.content + last.content,
        tool_calls=[c.to_tool_call() for c in calls if c.valid],
        invalid_tool_calls=[c.to_invalid_tool_call() for c in calls if not c.valid],
        calls=calls,
    )
