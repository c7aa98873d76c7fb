"""Llama-3.1/3.2/3.3 JSON tool calls. Pure.

The whole reply is ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``,
several objects separated by ``;``), or the built-in-tool form
``<|python_tag|>tool.call(arg="...")``. A reply without the tag is a call only when every
JSON object in it is shaped like one.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from langchain_ascend.tool_formats.format_base import (
    RawCall,
    ToolFormat,
    args_format,
    call_from_object,
    decode_objects,
    guess_name,
    looks_like_call,
    one_or_more,
    parameters_of,
)

PYTHON_TAG = "<|python_tag|>"
_CALL_HEAD = '{"name": '
_CALL_PARAMETERS = ', "parameters": '
_CALL_END = "}"
CALL_SEPARATOR = "; "


class Llama3JsonFormat(ToolFormat):
    """``{"name", "parameters"}`` objects, optionally after ``<|python_tag|>``."""

    name = "llama3_json"
    markers = (PYTHON_TAG,)
    bare_json = True

    def parse(self, text: str, *, terminated: bool = True) -> tuple[list[RawCall], str]:
        return parse_payload(text, tagged=True) or [], ""

    def parse_bare(self, text: str) -> list[RawCall] | None:
        return parse_payload(text, tagged=False)

    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool,
                special_tokens: Collection[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        calls = [
            {
                "type": "tag",
                "begin": _CALL_HEAD + json.dumps(t["function"]["name"]) + _CALL_PARAMETERS,
                "content": args_format(parameters_of(t), []),
                "end": _CALL_END,
            }
            for t in tools
        ]
        return one_or_more(calls, CALL_SEPARATOR, parallel=parallel), ()


def _parse_python_call(text: str) -> RawCall | None:
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
            return RawCall(node.func.value.id, None, raw, error="**kwargs are not supported")
        try:
            args[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            return RawCall(
                node.func.value.id, None, raw, error=f"argument {keyword.arg!r} is not a literal"
            )
    return RawCall(node.func.value.id, args, raw)


def parse_payload(text: str, *, tagged: bool) -> list[RawCall] | None:
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
        objects = decode_objects(text, separators=";")
    except ValueError as exc:
        if tagged:
            python_call = _parse_python_call(text)
            if python_call is not None:
                return [python_call]
            return [RawCall(guess_name(text), None, raw, error=str(exc))]
        if text.lstrip().startswith('{"name"'):
            return [RawCall(guess_name(text), None, raw, error=str(exc))]
        return None
    if not objects:
        return [] if tagged else None
    if not tagged and not all(looks_like_call(obj) for obj in objects):
        return None
    keys = ("parameters", "arguments")
    if len(objects) == 1:
        return [call_from_object(objects[0], raw, keys)]
    return [call_from_object(obj, json.dumps(obj, ensure_ascii=False), keys) for obj in objects]


LLAMA3_JSON = Llama3JsonFormat()
