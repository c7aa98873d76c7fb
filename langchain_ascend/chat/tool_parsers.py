"""Turn a model's raw text into LangChain tool calls, for the common open-model formats.

Pure Python (no torch). Formats understood:

* ``hermes`` (Hermes / Qwen2.5 / Qwen3): ``<tool_call>{"name", "arguments"}</tool_call>`` blocks.
* ``llama3_json`` (Llama-3.1/3.2/3.3): the whole reply is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``, several objects separated by ``;``), or the
  built-in-tool form ``<|python_tag|>tool.call(arg="...")``.
* ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (v3-v7) and
  ``[TOOL_CALLS]name[ARGS]{...}`` (v11+, optionally ``name[CALL_ID]id[ARGS]{...}``).
* ``auto``: all of these by their markers; bare JSON is a call only with ``name`` and
  ``arguments``/``parameters`` (naming a bound tool, when the names are known).

One streaming parser (:class:`ToolCallStreamParser`) serves the streamed and the one-shot path
(:func:`parse_tool_calls` feeds it the whole text), so ``invoke`` and ``stream`` agree. Text
outside calls stays content (whitespace touching a call trimmed); a malformed call never raises
but becomes an ``InvalidToolCall`` with the raw text and the error.
"""

from __future__ import annotations

import ast
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
from langchain_ascend.chat.tool_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ToolCallFormat = Literal["auto", "hermes", "llama3_json", "mistral"]
TOOL_CALL_FORMATS: tuple[str, ...] = ("auto", "hermes", "llama3_json", "mistral")

HERMES_OPEN, HERMES_CLOSE = TOOL_CALL_OPEN, TOOL_CALL_CLOSE  # the fallback format's markers
MISTRAL_MARKER = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
PYTHON_TAG = "<|python_tag|>"

TOOL_CALL_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": (HERMES_OPEN, HERMES_CLOSE),
    "llama3_json": (PYTHON_TAG,),
    "mistral": (MISTRAL_MARKER, MISTRAL_ARGS, MISTRAL_CALL_ID),
}
"""Each format's marker texts, the call opener first (the one home of this table)."""


def markers_of(fmt: ToolCallFormat) -> tuple[str, ...]:
    """The marker texts of ``fmt`` (``"auto"``: of every format)."""
    if fmt in TOOL_CALL_MARKERS:
        return TOOL_CALL_MARKERS[fmt]
    return tuple(m for markers in TOOL_CALL_MARKERS.values() for m in markers)


def call_openers(fmt: ToolCallFormat) -> list[str]:
    """The texts that open a call in ``fmt`` (``"auto"``: in any format)."""
    formats = [fmt] if fmt in TOOL_CALL_MARKERS else list(TOOL_CALL_MARKERS)
    return [TOOL_CALL_MARKERS[f][0] for f in formats]

_DECODER = json.JSONDecoder(strict=False)  # models write raw newlines inside strings


def detect_tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """Guess the tool-call format a chat template teaches its model.

    Args:
        chat_template: The tokenizer's Jinja chat template source (``None`` when absent).

    Returns:
        ``"hermes"``, ``"mistral"``, ``"llama3_json"``, or ``"auto"`` when the template gives
        no recognisable hint.
    """
    if not chat_template:
        return "auto"
    if HERMES_OPEN in chat_template:
        return "hermes"
    if MISTRAL_MARKER in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template or '"parameters"' in chat_template:
        return "llama3_json"
    return "auto"


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
    """What one :meth:`ToolCallStreamParser.feed` produced: new content and finished calls."""

    content: str = ""
    calls: list[ExtractedCall] = field(default_factory=list)


@dataclass
class _RawCall:
    """A call before it gets its index: name/args or an error."""

    name: str | None
    args: dict[str, Any] | None
    raw: str
    id: str | None = None
    error: str | None = None


# ---------------------------------------------------------------------------------------------
# Pure per-format parsers
# ---------------------------------------------------------------------------------------------


def _decode_objects(text: str, *, separators: str = "") -> list[Any]:
    """Decode consecutive JSON values in ``text`` separated by whitespace or ``separators``.

    Raises:
        ValueError: On malformed JSON or stray text, with a message saying where.
    """
    values: list[Any] = []
    pos = 0
    skip = " \t\r\n" + separators
    while True:
        while pos < len(text) and text[pos] in skip:
            pos += 1
        if pos >= len(text):
            return values
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
        values.append(value)


def _arguments_of(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Read a call's arguments under the first present key; a JSON string is decoded."""
    for key in keys:
        if key in obj:
            value = obj[key]
            break
    else:
        return {}
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = _DECODER.decode(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments string is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def _call_from_object(obj: Any, raw: str, keys: tuple[str, ...]) -> _RawCall:
    if not isinstance(obj, dict):
        return _RawCall(None, None, raw, error=f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if isinstance(obj.get("function"), dict):  # OpenAI-shaped {"function": {"name", ...}}
        fn = obj["function"]
        name = fn.get("name")
        obj = {**fn, "id": obj.get("id")}
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    if not isinstance(name, str) or not name:
        return _RawCall(None, None, raw, call_id, error="tool call has no string 'name'")
    try:
        args = _arguments_of(obj, keys)
    except ValueError as exc:
        return _RawCall(name, None, raw, call_id, error=str(exc))
    return _RawCall(name, args, raw, call_id)


def parse_hermes_block(body: str, *, terminated: bool = True) -> list[_RawCall]:
    """Parse the inside of one ``<tool_call>...</tool_call>`` block.

    Args:
        body: Text between the markers.
        terminated: False when the closing ``</tool_call>`` never came; the block still counts
            if its JSON is complete.

    Returns:
        One call per JSON object in the block (usually one), or one invalid call.
    """
    raw = HERMES_OPEN + body + (HERMES_CLOSE if terminated else "")
    try:
        objects = _decode_objects(body)
    except ValueError as exc:
        reason = str(exc) if terminated else f"unterminated {HERMES_OPEN} block, {exc}"
        return [_RawCall(_guess_name(body), None, raw, error=reason)]
    if not objects:
        return [_RawCall(None, None, raw, error=f"empty {HERMES_OPEN} block")]
    if len(objects) == 1:
        return [_call_from_object(objects[0], raw, ("arguments", "parameters"))]
    return [_call_from_object(obj, raw, ("arguments", "parameters")) for obj in objects]


def _parse_python_call(text: str) -> _RawCall | None:
    """Parse Llama's built-in-tool form ``tool.call(key=literal, ...)``; None if not that."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
        and not node.args
    ):
        return None
    args: dict[str, Any] = {}
    raw = PYTHON_TAG + text
    for keyword in node.keywords:
        if keyword.arg is None:
            return _RawCall(node.func.value.id, None, raw, error="**kwargs are not supported")
        try:
            args[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            return _RawCall(
                node.func.value.id, None, raw, error=f"argument {keyword.arg!r} is not a literal"
            )
    return _RawCall(node.func.value.id, args, raw)


def parse_llama_payload(text: str, *, tagged: bool) -> list[_RawCall] | None:
    """Parse Llama-3 JSON tool calls.

    Args:
        text: The reply after ``<|python_tag|>`` (``tagged``) or the whole reply (bare).
        tagged: Whether the reply started with ``<|python_tag|>``. A bare reply that is not
            shaped like calls is plain content and gives ``None``.

    Returns:
        The calls, or ``None`` when a bare reply is not a tool call.
    """
    raw = (PYTHON_TAG if tagged else "") + text
    try:
        objects = _decode_objects(text, separators=";")
    except ValueError as exc:
        if tagged:
            python_call = _parse_python_call(text)
            if python_call is not None:
                return [python_call]
            return [_RawCall(_guess_name(text), None, raw, error=str(exc))]
        if text.lstrip().startswith('{"name"'):
            return [_RawCall(_guess_name(text), None, raw, error=str(exc))]
        return None
    if not objects:
        return [] if tagged else None
    if not tagged and not all(_looks_like_call(obj) for obj in objects):
        return None
    keys = ("parameters", "arguments")
    if len(objects) == 1:
        return [_call_from_object(objects[0], raw, keys)]
    return [_call_from_object(obj, json.dumps(obj, ensure_ascii=False), keys) for obj in objects]


def parse_mistral_payload(text: str) -> tuple[list[_RawCall], str]:
    """Parse what follows the first ``[TOOL_CALLS]`` marker.

    Returns:
        ``(calls, trailing_content)``: text after a JSON array is content.
    """
    stripped = text.lstrip()
    if stripped.startswith("["):
        raw = MISTRAL_MARKER + text
        try:
            value, end = _DECODER.raw_decode(stripped)
        except json.JSONDecodeError as exc:
            return [_RawCall(_guess_name(text), None, raw, error=f"invalid JSON: {exc}")], ""
        items = value if isinstance(value, list) else [value]
        if len(items) == 1:
            calls = [_call_from_object(items[0], raw, ("arguments", "parameters"))]
        else:
            calls = [
                _call_from_object(item, json.dumps(item, ensure_ascii=False), ("arguments",))
                for item in items
            ]
        return calls, stripped[end:].strip()
    calls = []
    for piece in text.split(MISTRAL_MARKER):
        if piece.strip():
            calls.append(_parse_mistral_v11_call(piece))
    return calls, ""


def _parse_mistral_v11_call(piece: str) -> _RawCall:
    """Parse ``name[ARGS]{json}`` or ``name[CALL_ID]id[ARGS]{json}``."""
    raw = MISTRAL_MARKER + piece
    head, sep, args_text = piece.partition(MISTRAL_ARGS)
    if not sep:
        return _RawCall(piece.strip() or None, None, raw, error=f"missing {MISTRAL_ARGS} marker")
    raw_name, _, raw_id = head.partition(MISTRAL_CALL_ID)
    name = raw_name.strip()
    call_id = raw_id.strip() or None
    try:
        objects = _decode_objects(args_text)
    except ValueError as exc:
        return _RawCall(name or None, None, raw, call_id, error=str(exc))
    if len(objects) != 1 or not isinstance(objects[0], dict):
        return _RawCall(name or None, None, raw, call_id, error="arguments must be one JSON object")
    if not name:
        return _RawCall(None, None, raw, call_id, error="tool call has no name")
    return _RawCall(name, objects[0], raw, call_id)


def _looks_like_call(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and ("parameters" in obj or "arguments" in obj)
    )


def _guess_name(text: str) -> str | None:
    """Best-effort tool name from broken JSON (for the InvalidToolCall)."""
    marker = '"name"'
    start = text.find(marker)
    if start < 0:
        return None
    rest = text[start + len(marker) :].lstrip()
    if not rest.startswith(":"):
        return None
    rest = rest[1:].lstrip()
    if not rest.startswith('"'):
        return None
    end = rest.find('"', 1)
    return rest[1:end] if end > 1 else None


# ---------------------------------------------------------------------------------------------
# Streaming splitter
# ---------------------------------------------------------------------------------------------


_MARKERS_BY_FORMAT: dict[str, tuple[str, ...]] = {
    "auto": (HERMES_OPEN, MISTRAL_MARKER, PYTHON_TAG),
    "hermes": (HERMES_OPEN,),
    "mistral": (MISTRAL_MARKER,),
    "llama3_json": (PYTHON_TAG,),
}


class ToolCallStreamParser:
    """Split streamed model text into content and tool calls as it arrives.

    Content is released as soon as it cannot be the start of a call marker; a Hermes call is
    released when its ``</tool_call>`` arrives; Mistral, ``<|python_tag|>`` and bare-JSON
    calls run to the end of the reply and are released by :meth:`finish`.

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
        if fmt not in _MARKERS_BY_FORMAT:
            raise ValueError(f"unknown tool call format {fmt!r}; expected one of {TOOL_CALL_FORMATS}")
        self._markers = _MARKERS_BY_FORMAT[fmt]
        self._tool_names = set(tool_names) if tool_names is not None else None
        self._allow_bare = fmt in ("auto", "llama3_json") if allow_bare_json is None else allow_bare_json
        self._id_factory = id_factory
        self._buf = ""
        self._mode: Literal["text", "hermes", "tail"] = "text"
        self._tail_kind: Literal["bare", "python_tag", "mistral"] | None = None
        self._seen_content = False
        self._after_call = False
        self._held_ws = ""
        self._num_calls = 0
        self._finished = False

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
        if self._mode == "hermes":
            self._release(delta, parse_hermes_block(self._buf, terminated=False))
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
            if self._mode == "hermes":
                end = self._buf.find(HERMES_CLOSE)
                if end < 0:
                    return
                body = self._buf[:end]
                self._buf = self._buf[end + len(HERMES_CLOSE) :]
                self._release(delta, parse_hermes_block(body))
                self._mode = "text"
                continue
            if self._mode == "tail":
                return
            if self._bare_json_possible():
                stripped = self._buf.lstrip()
                if not stripped:
                    return  # only whitespace so far: wait
                if stripped.startswith("{"):
                    self._mode, self._tail_kind = "tail", "bare"
                    return
            start, marker = self._find_marker()
            if marker is None:
                keep = self._partial_marker_suffix()
                self._emit_content(delta, self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return
            self._emit_content(delta, self._buf[:start])
            self._held_ws = ""
            self._buf = self._buf[start + len(marker) :]
            if marker == HERMES_OPEN:
                self._mode = "hermes"
            else:
                self._mode = "tail"
                self._tail_kind = "mistral" if marker == MISTRAL_MARKER else "python_tag"

    def _bare_json_possible(self) -> bool:
        return self._allow_bare and not self._seen_content and self._num_calls == 0

    def _find_marker(self) -> tuple[int, str | None]:
        best, found = len(self._buf) + 1, None
        for marker in self._markers:
            pos = self._buf.find(marker)
            if 0 <= pos < best:
                best, found = pos, marker
        return best, found

    def _partial_marker_suffix(self) -> int:
        """Length of the longest tail of the buffer that could begin a marker."""
        longest = 0
        for marker in self._markers:
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

    def _release(self, delta: ParserDelta, raw_calls: list[_RawCall]) -> None:
        for raw in raw_calls:
            error = raw.error
            if error is None and (raw.args is None or not raw.name):
                error = "tool call has no name or arguments"
            delta.calls.append(
                ExtractedCall(
                    index=self._num_calls,
                    id=raw.id or self._id_factory(),
                    name=raw.name,
                    args=raw.args if error is None else None,
                    raw=raw.raw,
                    error=error,
                )
            )
            self._num_calls += 1
        self._after_call = True

    def _finish_tail(self, delta: ParserDelta) -> None:
        text = self._buf
        if self._tail_kind == "mistral":
            mistral_calls, trailing = parse_mistral_payload(text)
            self._release(delta, mistral_calls)
            self._emit_content(delta, trailing)
            return
        tagged = self._tail_kind == "python_tag"
        calls: list[_RawCall] | None = parse_llama_payload(text, tagged=tagged)
        if calls is not None and not tagged and self._tool_names is not None:
            if any(c.name is not None and c.name not in self._tool_names for c in calls):
                calls = None
        if calls is None:  # a bare JSON reply that is content after all
            self._held_ws = ""
            self._emit_content(delta, text)
            return
        self._release(delta, calls)


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
