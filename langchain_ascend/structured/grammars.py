"""Grammar specifications for constrained decoding. Pure: dicts and strings, no xgrammar.

A :class:`GrammarSpec` says *what* the model must write; ``xgrammar_backend`` compiles it for a
tokenizer (cached per spec) and drives the per-request matcher. Three kinds:

* ``json_schema`` — a JSON value matching a schema, written like Python's ``json.dumps``
  (``", "`` and ``": "`` separators, no other whitespace), so a random-weight model cannot
  wander off into endless whitespace;
* ``json_object`` — any JSON object (``json_mode``);
* ``structural_tag`` — xgrammar's structural-tag format, used for forced tool calls in the
  model's own tool-call syntax (Hermes ``<tool_call>`` blocks, Llama JSON, Mistral
  ``[TOOL_CALLS]``), each call's ``arguments`` matching that tool's parameter schema, and for
  ``tool_choice="none"`` (free text without call markers).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_ascend.chat.tool_format import (
    BODY_SUFFIX,
    CALL_SEPARATOR,
    CALL_SUFFIX,
    body_prefix,
    call_prefix,
)
from langchain_ascend.chat.tool_parsers import (
    HERMES_CLOSE,
    HERMES_OPEN,
    MISTRAL_MARKER,
    ToolCallFormat,
    call_openers,
)
from langchain_ascend.errors import InvalidRequestError

GrammarKind = Literal["json_schema", "json_object", "structural_tag"]

# Whitespace between JSON tokens inside forced tool arguments: at most one character, so the
# output stays JSON a template re-renders almost identically and generation cannot stall.
TOOL_ARGS_MAX_WHITESPACE = 1


@dataclass(frozen=True)
class GrammarSpec:
    """What a constrained generation must produce.

    Attributes:
        kind: ``json_schema``, ``json_object`` or ``structural_tag``.
        source: Compact JSON text of the schema / structural tag (empty for json_object),
            keys in their given order; with ``kind`` it is the compile-cache key.
        required_special_tokens: Special-token strings the grammar itself writes (e.g.
            Mistral's ``[TOOL_CALLS]``); every other special token is masked out.
        free_text: The grammar allows free text that may end anywhere (stop strings and
            reasoning still apply); False for JSON and forced tool calls.
    """

    kind: GrammarKind
    source: str = ""
    required_special_tokens: tuple[str, ...] = ()
    free_text: bool = False

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.kind, self.source)


def no_tool_call_grammar(fmt: ToolCallFormat, special_tokens: Collection[str] = ()) -> GrammarSpec:
    """Grammar for ``tool_choice="none"``: any text that never starts a tool call.

    The tools stay in the prompt (so the prompt prefix, and its KV cache, is the same as on the
    hops that may call tools); this grammar keeps the reply free of call markers. Markers that
    are special tokens need nothing: special tokens are masked out anyway.
    """
    markers = call_openers(fmt)
    excludes = [m for m in markers if m not in special_tokens]
    tag = {"type": "structural_tag", "format": {"type": "any_text", "excludes": excludes}}
    return GrammarSpec("structural_tag", _canonical(tag), free_text=True)


def _canonical(value: Any) -> str:
    # Key order is kept: xgrammar writes object properties in the schema's declared order.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_schema_grammar(schema: Mapping[str, Any]) -> GrammarSpec:
    """Grammar for one JSON value matching ``schema`` (a JSON-schema dict).

    Raises:
        InvalidRequestError: ``schema`` is not a dict.
    """
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"a JSON schema must be a dict, got {type(schema).__name__}")
    return GrammarSpec("json_schema", _canonical(dict(schema)))


def json_object_grammar() -> GrammarSpec:
    """Grammar for any JSON object (``json_mode``)."""
    return GrammarSpec("json_object")


def _parameters_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return dict(params)


def _args_format(params: Mapping[str, Any], excludes: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": dict(params),
        "max_whitespace_cnt": TOOL_ARGS_MAX_WHITESPACE,
        "excludes": list(excludes),
    }


def _marker(text: str, special_tokens: Collection[str]) -> dict[str, Any]:
    """A literal that is a single special token in this vocabulary must be written as one."""
    if text in special_tokens:
        return {"type": "token", "token": text}
    return {"type": "const_string", "value": text}


def _hermes_call(tool: Mapping[str, Any], special_tokens: Collection[str]) -> dict[str, Any]:
    """One Hermes call as a structural tag; markers that are special tokens are written as
    their single token (what a tool-tuned model was trained to emit)."""
    name = tool["function"]["name"]
    args = _args_format(_parameters_of(tool), [HERMES_OPEN, HERMES_CLOSE])
    if HERMES_OPEN not in special_tokens and HERMES_CLOSE not in special_tokens:
        return {"type": "tag", "begin": call_prefix(name), "content": args, "end": CALL_SUFFIX}
    body = {"type": "sequence", "elements": [
        {"type": "const_string", "value": body_prefix(name)}, args,
        {"type": "const_string", "value": BODY_SUFFIX}]}
    opener, closer = (_marker(m, special_tokens) for m in (HERMES_OPEN, HERMES_CLOSE))
    return {"type": "tag", "begin": opener if opener["type"] == "token" else HERMES_OPEN,
            "content": body, "end": closer if closer["type"] == "token" else HERMES_CLOSE}


def select_tools(
    tools: Sequence[Mapping[str, Any]], tool_name: str | None
) -> list[Mapping[str, Any]]:
    """The tools a forced call may use: all of them, or the one named.

    Raises:
        InvalidRequestError: No tools, or ``tool_name`` names none of them.
    """
    if not tools:
        raise InvalidRequestError("tool_choice forces a tool call but no tools are bound")
    if tool_name is None:
        return list(tools)
    chosen = [t for t in tools if t["function"]["name"] == tool_name]
    if not chosen:
        names = [t["function"]["name"] for t in tools]
        raise InvalidRequestError(f"tool_choice names {tool_name!r}, not one of the tools {names}")
    return chosen


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    *,
    fmt: ToolCallFormat,
    tool_name: str | None = None,
    parallel: bool = False,
    special_tokens: Collection[str] = (),
) -> GrammarSpec:
    """Grammar forcing the reply to be tool call(s) in the model's syntax, then EOS.

    Args:
        tools: OpenAI-format tool dicts (``{"type": "function", "function": {...}}``).
        fmt: The model's tool-call syntax; ``auto`` uses the Hermes/Qwen syntax.
        tool_name: Force this tool; ``None`` lets the model pick among ``tools``.
        parallel: Allow several calls (Hermes: several blocks; Mistral: several array items;
            Llama: ``;``-separated objects) instead of exactly one.
        special_tokens: Special-token strings of the vocabulary (so ``[TOOL_CALLS]`` is written
            as its single token when it is one).

    Returns:
        A ``structural_tag`` spec. Tool arguments match each tool's parameter schema; the
        markers of the format never appear inside argument strings.

    Raises:
        InvalidRequestError: No tools, or an unknown ``tool_name``.
    """
    chosen = select_tools(tools, tool_name)
    required: list[str] = []
    if fmt == "mistral":
        excludes = [MISTRAL_MARKER]
        calls = [
            {
                "type": "tag",
                "begin": '{"name": ' + json.dumps(t["function"]["name"]) + ', "arguments": ',
                "content": _args_format(_parameters_of(t), excludes),
                "end": "}",
            }
            for t in chosen
        ]
        body = {
            "type": "tags_with_separator",
            "tags": calls,
            "separator": ", ",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
        marker = _marker(MISTRAL_MARKER, special_tokens)
        if marker["type"] == "token":
            required.append(MISTRAL_MARKER)
        root: dict[str, Any] = {
            "type": "sequence",
            "elements": [
                marker,
                {"type": "const_string", "value": "["},
                body,
                {"type": "const_string", "value": "]"},
            ],
        }
    elif fmt == "llama3_json":
        calls = [
            {
                "type": "tag",
                "begin": '{"name": ' + json.dumps(t["function"]["name"]) + ', "parameters": ',
                "content": _args_format(_parameters_of(t), []),
                "end": "}",
            }
            for t in chosen
        ]
        root = {
            "type": "tags_with_separator",
            "tags": calls,
            "separator": "; ",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    else:
        calls = [_hermes_call(t, special_tokens) for t in chosen]
        required += [m for m in (HERMES_OPEN, HERMES_CLOSE) if m in special_tokens]
        root = {
            "type": "tags_with_separator",
            "tags": calls,
            "separator": CALL_SEPARATOR,
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    tag = {"type": "structural_tag", "format": root}
    return GrammarSpec("structural_tag", _canonical(tag), tuple(required))
