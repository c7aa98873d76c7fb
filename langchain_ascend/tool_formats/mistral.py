"""Mistral tool calls. Pure.

``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (v3-v7) and
``[TOOL_CALLS]name[ARGS]{...}`` (v11+, optionally ``name[CALL_ID]id[ARGS]{...}``). The calls run
to the end of the reply; text after a JSON array is content.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from langchain_ascend.tool_formats.format_base import (
    DECODER,
    RawCall,
    ToolFormat,
    args_format,
    call_from_object,
    decode_objects,
    guess_name,
    literal,
    one_or_more,
    parameters_of,
)

MISTRAL_MARKER = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
_CALL_HEAD = '{"name": '
_CALL_ARGUMENTS = ', "arguments": '
_CALL_END = "}"
_LIST_OPEN, _LIST_CLOSE, CALL_SEPARATOR = "[", "]", ", "


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS]`` then a JSON list of calls, or v11's ``name[ARGS]{...}`` pieces."""

    name = "mistral"
    markers = (MISTRAL_MARKER, MISTRAL_ARGS, MISTRAL_CALL_ID)

    def parse(self, text: str, *, terminated: bool = True) -> tuple[list[RawCall], str]:
        return parse_payload(text)

    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool,
                special_tokens: Collection[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        calls = [
            {
                "type": "tag",
                "begin": _CALL_HEAD + json.dumps(t["function"]["name"]) + _CALL_ARGUMENTS,
                "content": args_format(parameters_of(t), [MISTRAL_MARKER]),
                "end": _CALL_END,
            }
            for t in tools
        ]
        marker = literal(MISTRAL_MARKER, special_tokens)
        root = {
            "type": "sequence",
            "elements": [
                marker,
                {"type": "const_string", "value": _LIST_OPEN},
                one_or_more(calls, CALL_SEPARATOR, parallel=parallel),
                {"type": "const_string", "value": _LIST_CLOSE},
            ],
        }
        return root, (MISTRAL_MARKER,) if marker["type"] == "token" else ()


def parse_payload(text: str) -> tuple[list[RawCall], str]:
    """Parse what follows the first ``[TOOL_CALLS]`` marker.

    Returns:
        ``(calls, trailing_content)``: text after a JSON array is content.
    """
    stripped = text.lstrip()
    if stripped.startswith(_LIST_OPEN):
        raw = MISTRAL_MARKER + text
        try:
            value, end = DECODER.raw_decode(stripped)
        except json.JSONDecodeError as exc:
            return [RawCall(guess_name(text), None, raw, error=f"invalid JSON: {exc}")], ""
        items = value if isinstance(value, list) else [value]
        if len(items) == 1:
            calls = [call_from_object(items[0], raw, ("arguments", "parameters"))]
        else:
            calls = [
                call_from_object(item, json.dumps(item, ensure_ascii=False), ("arguments",))
                for item in items
            ]
        return calls, stripped[end:].strip()
    calls = []
    for piece in text.split(MISTRAL_MARKER):
        if piece.strip():
            calls.append(_parse_v11_call(piece))
    return calls, ""


def _parse_v11_call(piece: str) -> RawCall:
    """Parse ``name[ARGS]{json}`` or ``name[CALL_ID]id[ARGS]{json}``."""
    raw = MISTRAL_MARKER + piece
    head, sep, args_text = piece.partition(MISTRAL_ARGS)
    if not sep:
        return RawCall(piece.strip() or None, None, raw, error=f"missing {MISTRAL_ARGS} marker")
    raw_name, _, raw_id = head.partition(MISTRAL_CALL_ID)
    name = raw_name.strip()
    call_id = raw_id.strip() or None
    try:
        objects = decode_objects(args_text)
    except ValueError as exc:
        return RawCall(name or None, None, raw, call_id, error=str(exc))
    if len(objects) != 1 or not isinstance(objects[0], dict):
        return RawCall(name or None, None, raw, call_id, error="arguments must be one JSON object")
    if not name:
        return RawCall(None, None, raw, call_id, error="tool call has no name")
    return RawCall(name, objects[0], raw, call_id)


MISTRAL = MistralFormat()
