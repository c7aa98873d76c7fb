"""The fallback tool-calling format: one definition for the prompt, the history, the parser and
the grammar. Pure (no torch).

A chat template that ignores ``tools`` (SmolLM2's ChatML renders only role + content) gives the
model no idea that tools exist. For such templates the chat model writes the tools into the
system turn itself, in the Hermes/Qwen convention, and reads the reply back in the same format:

* tools: a ``# Tools`` section with one JSON function schema per line inside
  ``<tools>...</tools>`` and the instruction to answer with ``<tool_call>`` blocks
  (:func:`render_tools_section`);
* a call (what the model writes, what the forcing grammar produces, and how earlier calls are
  shown in the history)::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

  several calls are separated by a newline (:func:`render_call`, :func:`render_calls`,
  :func:`call_prefix`, :data:`CALL_SUFFIX`, :data:`CALL_SEPARATOR`);
* a tool result, in a ``user`` turn (consecutive results share one turn)::

      <tool_response>
      {"name": "get_weather", "tool_call_id": "call_1", "content": "sunny"}
      </tool_response>

  (:func:`render_tool_response`).

Everything is built from the marker and call-layout constants below, so the prompt's
instruction, the rendered history, :mod:`~langchain_ascend.chat.tool_parsers` (``hermes``) and
the forced-call grammar (:func:`~langchain_ascend.structured.grammars.tool_call_grammar`) cannot
drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def body_prefix(name: str) -> str:
    """The text between the opening marker and the arguments of a call of ``name``."""
    return _BODY_HEAD + _dumps(name) + _CALL_ARGUMENTS


def call_prefix(name: str) -> str:
    """The text of a call of ``name`` up to its arguments (the grammar's tag opener)."""
    return TOOL_CALL_OPEN + body_prefix(name)


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the fallback format."""
    return call_prefix(name) + _dumps(dict(arguments)) + CALL_SUFFIX


def render_calls(calls: Sequence[Mapping[str, Any]]) -> str:
    """Template-dict tool calls (``{"function": {"name", "arguments"}}``) in the fallback format.

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
        rendered.append(render_call(str(function["name"]), arguments))
    return CALL_SEPARATOR.join(rendered)


def render_tool_response(name: str | None, tool_call_id: str | None, content: str) -> str:
    """One tool result block (name, call id and the result text)."""
    body = {"name": name, "tool_call_id": tool_call_id, "content": content}
    return TOOL_RESPONSE_OPEN + "\n" + _dumps(body) + "\n" + TOOL_RESPONSE_CLOSE


def render_tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-turn text that describes ``tools`` (OpenAI tool dicts) and the call format."""
    schemas = "\n".join(_dumps(dict(tool)) for tool in tools)
    example = _CALL_HEAD + "<function-name>" + _CALL_ARGUMENTS + "<args-json-object>" + CALL_SUFFIX
    return (
        _INTRO + TOOLS_OPEN + "\n" + schemas + "\n" + TOOLS_CLOSE + "\n\n"
        + _INSTRUCTION + example + _RESULTS_NOTE
    )
