"""Hermes / Qwen2.5 / Qwen3 tool calls, also the fallback for templates that ignore tools. Pure.

A call (what the model writes, what the forcing grammar produces, and how earlier calls are
shown in the history)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

several calls are separated by a newline. A chat template that ignores ``tools`` (SmolLM2's
ChatML renders only role + content) gives the model no idea that tools exist; for such
templates the chat model writes the tools into the system turn itself with
:meth:`HermesFormat.render_tools_section` (one JSON schema per line inside ``<tools>``), earlier
calls with :meth:`~HermesFormat.render_calls` and results as ``<tool_response>`` blocks in a
``user`` turn (:meth:`~HermesFormat.render_tool_response`). Prompt, history, parser and grammar
are all built from the constants below.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from langchain_ascend.tool_formats.format_base import (
    RawCall,
    ToolFormat,
    args_format,
    call_from_object,
    decode_objects,
    dumps,
    guess_name,
    literal,
    one_or_more,
    parameters_of,
)

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOLS_OPEN = "<tools>"
TOOLS_CLOSE = "</tools>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

# One call: the markers around a JSON object with "name" then "arguments" (in that order).
_BODY_HEAD = '\n{"name": '
_CALL_HEAD = TOOL_CALL_OPEN + _BODY_HEAD
_CALL_ARGUMENTS = ', "arguments": '
BODY_SUFFIX = "}\n"
CALL_SUFFIX = BODY_SUFFIX + TOOL_CALL_CLOSE
CALL_SEPARATOR = "\n"

_INTRO = (
    "# Tools\n\n"
    "You may call one or more functions to help with the user's request. The functions are "
    f"described by the JSON schemas inside {TOOLS_OPEN}{TOOLS_CLOSE}:\n"
)
_INSTRUCTION = (
    "To call a function, answer with a JSON object holding its name and arguments inside "
    f"{TOOL_CALL_OPEN}{TOOL_CALL_CLOSE}, one block per call:\n"
)
_RESULTS_NOTE = (
    f"\n\nEach result comes back inside {TOOL_RESPONSE_OPEN}{TOOL_RESPONSE_CLOSE}, naming the "
    "function and the call id."
)


def body_prefix(name: str) -> str:
    """The text between the opening marker and the arguments of a call of ``name``."""
    return _BODY_HEAD + dumps(name) + _CALL_ARGUMENTS


def call_prefix(name: str) -> str:
    """The text of a call of ``name`` up to its arguments (the grammar's tag opener)."""
    return TOOL_CALL_OPEN + body_prefix(name)


class HermesFormat(ToolFormat):
    """``<tool_call>{"name", "arguments"}</tool_call>`` blocks; the fallback's format too."""

    name = "hermes"
    markers = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    closer = TOOL_CALL_CLOSE

    # ---- parsing ----------------------------------------------------------------------------
    def parse(self, text: str, *, terminated: bool = True) -> tuple[list[RawCall], str]:
        return parse_block(text, terminated=terminated), ""

    # ---- grammar ----------------------------------------------------------------------------
    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool,
                special_tokens: Collection[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        calls = [self._call_tag(tool, special_tokens) for tool in tools]
        required = tuple(m for m in self.markers if m in special_tokens)
        return one_or_more(calls, CALL_SEPARATOR, parallel=parallel), required

    @staticmethod
    def _call_tag(tool: Mapping[str, Any], special_tokens: Collection[str]) -> dict[str, Any]:
        """One call as a structural tag; markers that are special tokens are written as their
        single token (what a tool-tuned model was trained to emit)."""
        name = tool["function"]["name"]
        args = args_format(parameters_of(tool), [TOOL_CALL_OPEN, TOOL_CALL_CLOSE])
        if TOOL_CALL_OPEN not in special_tokens and TOOL_CALL_CLOSE not in special_tokens:
            return {"type": "tag", "begin": call_prefix(name), "content": args,
                    "end": CALL_SUFFIX}
        body = {"type": "sequence", "elements": [
            {"type": "const_string", "value": body_prefix(name)}, args,
            {"type": "const_string", "value": BODY_SUFFIX}]}
        opener, closer = (literal(m, special_tokens) for m in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE))
        return {"type": "tag", "begin": opener if opener["type"] == "token" else TOOL_CALL_OPEN,
                "content": body,
                "end": closer if closer["type"] == "token" else TOOL_CALL_CLOSE}

    # ---- prompt rendering (the fallback) ------------------------------------------------------
    @staticmethod
    def render_call(name: str, arguments: Mapping[str, Any]) -> str:
        """One call in this format."""
        return call_prefix(name) + dumps(dict(arguments)) + CALL_SUFFIX

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        """Template-dict tool calls (``{"function": {"name", "arguments"}}``) in this format.

        ``arguments`` may be a dict or a JSON string (OpenAI style).
        """
        rendered = []
        for call in calls:
            function = call.get("function", call)
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError:
                    arguments = {"arguments": arguments}
            rendered.append(self.render_call(str(function["name"]), arguments))
        return CALL_SEPARATOR.join(rendered)

    @staticmethod
    def render_tool_response(name: str | None, tool_call_id: str | None, content: str) -> str:
        """One tool result block (name, call id and the result text)."""
        body = {"name": name, "tool_call_id": tool_call_id, "content": content}
        return TOOL_RESPONSE_OPEN + "\n" + dumps(body) + "\n" + TOOL_RESPONSE_CLOSE

    @staticmethod
    def render_tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
        """The system-turn text that describes ``tools`` (OpenAI tool dicts) and the format."""
        schemas = "\n".join(dumps(dict(tool)) for tool in tools)
        example = (_CALL_HEAD + "<function-name>" + _CALL_ARGUMENTS + "<args-json-object>"
                   + CALL_SUFFIX)
        return (
            _INTRO + TOOLS_OPEN + "\n" + schemas + "\n" + TOOLS_CLOSE + "\n\n"
            + _INSTRUCTION + example + _RESULTS_NOTE
        )


def parse_block(body: str, *, terminated: bool = True) -> list[RawCall]:
    """Parse the inside of one ``<tool_call>...</tool_call>`` block.

    Args:
        body: Text between the markers.
        terminated: False when the closing ``</tool_call>`` never came; the block still counts
            if its JSON is complete.

    Returns:
        One call per JSON object in the block (usually one), or one invalid call.
    """
    raw = TOOL_CALL_OPEN + body + (TOOL_CALL_CLOSE if terminated else "")
    try:
        objects = decode_objects(body)
    except ValueError as exc:
        reason = str(exc) if terminated else f"unterminated {TOOL_CALL_OPEN} block, {exc}"
        return [RawCall(guess_name(body), None, raw, error=reason)]
    if not objects:
        return [RawCall(None, None, raw, error=f"empty {TOOL_CALL_OPEN} block")]
    if len(objects) == 1:
        return [call_from_object(objects[0], raw, ("arguments", "parameters"))]
    return [call_from_object(obj, raw, ("arguments", "parameters")) for obj in objects]


HERMES = HermesFormat()
