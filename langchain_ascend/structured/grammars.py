"""Grammar specifications for constrained decoding. Pure: dicts and strings, no xgrammar.

A :class:`GrammarSpec` says *what* the model must write; ``xgrammar_backend`` compiles it for a
tokenizer (cached per spec) and drives the per-request matcher. Three kinds:

* ``json_schema`` — a JSON value matching a schema, written like Python's ``json.dumps``
  (``", "`` and ``": "`` separators, no other whitespace), so a random-weight model cannot
  wander off into endless whitespace;
* ``json_object`` — any JSON object (``json_mode``);
* ``structural_tag`` — xgrammar's structural-tag format, used for forced tool calls in the
  model's own tool-call syntax (each format object of :mod:`langchain_ascend.tool_formats`
  writes its own), each call's ``arguments`` matching that tool's parameter schema, and for
  ``tool_choice="none"`` (free text without call markers).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.tool_formats import ToolCallFormat, call_openers, forcing_format

GrammarKind = Literal["json_schema", "json_object", "structural_tag"]


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
        forced_prefix: Text every reply under the grammar starts with, known without compiling
            it (a forced call's opener, ``<tool_call>\n{"name": "f", "arguments": ``): the
            engine appends it before the grammar is ready (:func:`forced_prefix_of`).
    """

    kind: GrammarKind
    source: str = ""
    required_special_tokens: tuple[str, ...] = ()
    free_text: bool = False
    forced_prefix: str = ""

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


def forced_prefix_of(fmt: Mapping[str, Any]) -> str:
    """The text a structural-tag format forces at its start (``""`` when its first byte is
    already a choice or a special token): a constant string; a tag's text opener; a
    sequence's constant elements and then its first other element's prefix; the one tag of a
    ``tags_with_separator`` that needs at least one."""
    kind = fmt.get("type")
    if kind == "const_string":
        return str(fmt.get("value", ""))
    if kind == "tag":
        begin = fmt.get("begin")
        return begin if isinstance(begin, str) else ""
    if kind == "sequence":
        text = ""
        for element in fmt.get("elements") or ():
            text += forced_prefix_of(element)
            if element.get("type") != "const_string":
                break
        return text
    if kind == "tags_with_separator":
        tags = fmt.get("tags") or ()
        return forced_prefix_of(tags[0]) if len(tags) == 1 and fmt.get("at_least_one") else ""
    return ""


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
    root, required = forcing_format(fmt).grammar(
        select_tools(tools, tool_name), parallel=parallel, special_tokens=special_tokens)
    tag = {"type": "structural_tag", "format": root}
    return GrammarSpec("structural_tag", _canonical(tag), required,
                       forced_prefix=forced_prefix_of(root))
