"""What every tool-call format provides, and the JSON and grammar pieces they share. Pure.

A :class:`ToolFormat` is one model family's tool-call syntax, the way vLLM has one tool-parser
class per format: its marker texts, how the text after its opening marker becomes calls, and
the structural-tag grammar that forces calls in that syntax. Markers, parser and grammar are
built from the same constants, so they cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Whitespace between JSON tokens inside forced tool arguments: at most one character, so the
# output stays JSON a template re-renders almost identically and generation cannot stall.
TOOL_ARGS_MAX_WHITESPACE = 1

DECODER = json.JSONDecoder(strict=False)  # models write raw newlines inside strings


@dataclass
class RawCall:
    """A call as a format read it, before the reply gives it an index: name/args or an error."""

    name: str | None
    args: dict[str, Any] | None
    raw: str
    id: str | None = None
    error: str | None = None


class ToolFormat:
    """One tool-call syntax. Subclasses set the class attributes and the two methods.

    Attributes:
        name: The ``tool_call_format`` value that selects it.
        markers: Its marker texts, the one that opens a call first.
        closer: The marker that ends a call; ``None``: a call runs to the end of the reply.
        bare_json: A reply that is only JSON may be a call of this format (no marker).
    """

    name: str = ""
    markers: tuple[str, ...] = ()
    closer: str | None = None
    bare_json: bool = False

    @property
    def opener(self) -> str:
        """The marker that opens a call."""
        return self.markers[0]

    def parse(self, text: str, *, terminated: bool = True) -> tuple[list[RawCall], str]:
        """The calls in ``text`` (what follows the opener, up to the closer if the format has
        one) and the content after them. ``terminated`` is False when the closer never came.
        Never raises on a malformed call: it comes back with an ``error``."""
        raise NotImplementedError

    def parse_bare(self, text: str) -> list[RawCall] | None:
        """Calls of a reply without any marker, or ``None`` when it is plain content."""
        return None

    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool,
                special_tokens: Collection[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The structural-tag format forcing call(s) of ``tools`` in this syntax, and the
        special tokens it writes (markers that are single tokens of the vocabulary)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


# ---- JSON reading shared by the formats --------------------------------------------------------
def decode_objects(text: str, *, separators: str = "") -> list[Any]:
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
            value, pos = DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
        values.append(value)


def arguments_of(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
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
            value = DECODER.decode(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments string is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def call_from_object(obj: Any, raw: str, keys: tuple[str, ...]) -> RawCall:
    """A call from one decoded JSON object (``{"name", <keys>}`` or OpenAI's ``function``)."""
    if not isinstance(obj, dict):
        return RawCall(None, None, raw, error=f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if isinstance(obj.get("function"), dict):  # OpenAI-shaped {"function": {"name", ...}}
        fn = obj["function"]
        name = fn.get("name")
        obj = {**fn, "id": obj.get("id")}
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    if not isinstance(name, str) or not name:
        return RawCall(None, None, raw, call_id, error="tool call has no string 'name'")
    try:
        args = arguments_of(obj, keys)
    except ValueError as exc:
        return RawCall(name, None, raw, call_id, error=str(exc))
    return RawCall(name, args, raw, call_id)


def looks_like_call(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and ("parameters" in obj or "arguments" in obj)
    )


def guess_name(text: str) -> str | None:
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


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---- structural-tag pieces shared by the formats' grammars ------------------------------------
def parameters_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return dict(params)


def args_format(params: Mapping[str, Any], excludes: Sequence[str]) -> dict[str, Any]:
    """A call's arguments: JSON matching the tool's schema, never holding ``excludes``."""
    return {
        "type": "json_schema",
        "json_schema": dict(params),
        "max_whitespace_cnt": TOOL_ARGS_MAX_WHITESPACE,
        "excludes": list(excludes),
    }


def literal(text: str, special_tokens: Collection[str]) -> dict[str, Any]:
    """A literal that is a single special token in this vocabulary must be written as one."""
    if text in special_tokens:
        return {"type": "token", "token": text}
    return {"type": "const_string", "value": text}


def one_or_more(tags: list[dict[str, Any]], separator: str, *, parallel: bool) -> dict[str, Any]:
    """At least one of ``tags``; several, ``separator`` between them, only when ``parallel``."""
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
