"""Which grammar a request gets: ``response_format`` / ``tool_choice`` -> :class:`GrammarSpec`.

Pure (no xgrammar, no torch) except :func:`grammar_backend`, which loads the xgrammar backend
lazily. The chat model calls :func:`grammar_spec` per request and :func:`warm_up_specs` in
``warm_up``, so a warmed-up grammar is exactly the one a request asks for.

=============================================  ==========================================
request                                        grammar
=============================================  ==========================================
``response_format={"type": "text"}``           as without one (OpenAI's default)
``response_format={"type": "json_object"}``    any JSON object (unless a call is forced)
``response_format={"type": "json_schema"...}``  JSON matching the schema (the same)
``tool_choice="auto"`` (or no tools)           none
``tool_choice="none"`` with tools              free text without call markers
``tool_choice="required"``                     one or more calls (one if
                                               ``parallel_tool_calls=False``)
``tool_choice=<name>``                         exactly one call of that tool (several if
                                               ``parallel_tool_calls=True``)
=============================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured.grammars import (
    GrammarSpec,
    json_object_grammar,
    json_schema_grammar,
    no_tool_call_grammar,
    tool_call_grammar,
)
from langchain_ascend.tool_formats import ToolCallFormat, forcing_format


def forced_format(fmt: ToolCallFormat) -> ToolCallFormat:
    """The syntax a forced call is written in: ``auto`` (no hint) forces Hermes ``<tool_call>``."""
    return cast(ToolCallFormat, forcing_format(fmt).name)


def response_format_grammar(response_format: Any) -> GrammarSpec:
    """Grammar for an OpenAI-style ``response_format``.

    Raises:
        InvalidRequestError: An unknown or malformed ``response_format``.
    """
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_object":
            return json_object_grammar()
        if kind == "json_schema":
            body = response_format.get("json_schema") or {}
            schema = body.get("schema") if isinstance(body, Mapping) else None
            if isinstance(schema, Mapping):
                return json_schema_grammar(schema)
    raise InvalidRequestError(
        f"unsupported response_format {response_format!r}: use {{'type': 'text'}}, "
        "{'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {'schema': {...}}}"
    )


def grammar_spec(
    *,
    response_format: Any,
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str,
    parallel_tool_calls: bool | None,
    fmt: ToolCallFormat,
    special_tokens: Collection[str],
) -> GrammarSpec | None:
    """The grammar of one request (see the module table), or ``None`` for free generation.

    Args:
        response_format: The call's ``response_format`` (``None`` when absent): the reply's
            format where it is text, so it wins over ``"auto"`` and ``"none"``; a forced
            choice (``"required"``, a name) is a call, as with OpenAI (the call's result check
            then demands it: a JSON grammar there failed every such call).
        tools: Bound OpenAI-format tools.
        tool_choice: Normalised choice: ``"auto"``, ``"none"``, ``"required"`` or a tool name.
        parallel_tool_calls: The call's setting (``None``: the choice's default).
        fmt: The model's tool-call syntax.
        special_tokens: Special-token strings of the vocabulary.

    Raises:
        InvalidRequestError: A malformed ``response_format``, or a forced choice without tools.
    """
    if isinstance(response_format, Mapping) and response_format.get("type") == "text":
        response_format = None  # OpenAI's default: plain text
    if response_format is not None:
        text_format = response_format_grammar(response_format)  # checked either way
        if tool_choice in ("auto", "none") or not tools:
            return text_format
    if tool_choice == "auto" or (tool_choice == "none" and not tools):
        return None
    if tool_choice == "none":
        return no_tool_call_grammar(fmt, special_tokens)
    if tool_choice == "required":
        return tool_call_grammar(
            tools, fmt=forced_format(fmt), parallel=parallel_tool_calls is not False,
            special_tokens=special_tokens,
        )
    return tool_call_grammar(
        tools, fmt=forced_format(fmt), tool_name=tool_choice, parallel=bool(parallel_tool_calls),
        special_tokens=special_tokens,
    )


def warm_up_specs(
    tools: Sequence[Mapping[str, Any]],
    schemas: Sequence[Mapping[str, Any]],
    *,
    fmt: ToolCallFormat,
    special_tokens: Collection[str],
) -> list[GrammarSpec]:
    """The grammars worth compiling ahead: ``json_mode``; with tools ``tool_choice="none"``,
    ``"required"`` and each named tool; one JSON-schema grammar per output schema.

    Args:
        tools: OpenAI-format tools.
        schemas: JSON schemas (as ``with_structured_output`` sends them).
        fmt: The model's tool-call syntax.
        special_tokens: Special-token strings of the vocabulary.
    """

    def spec(**kwargs: Any) -> GrammarSpec:
        found = grammar_spec(fmt=fmt, special_tokens=special_tokens, **kwargs)
        assert found is not None  # every choice below constrains
        return found

    specs = [response_format_grammar({"type": "json_object"})]
    if tools:
        specs.append(spec(response_format=None, tools=tools, tool_choice="none",
                          parallel_tool_calls=None))
        specs.append(spec(response_format=None, tools=tools, tool_choice="required",
                          parallel_tool_calls=None))
        specs += [
            spec(response_format=None, tools=tools, tool_choice=tool["function"]["name"],
                 parallel_tool_calls=None)
            for tool in tools
        ]
    specs += [
        response_format_grammar({"type": "json_schema", "json_schema": {"schema": schema}})
        for schema in schemas
    ]
    return specs


def grammar_backend(engine: Any) -> Any:
    """The process-wide xgrammar backend of ``engine``'s tokenizer (imports xgrammar)."""
    from langchain_ascend.structured.xgrammar_backend import get_grammar_backend

    return get_grammar_backend(
        engine.tokenizer,
        vocab_size=engine.vocab_size or len(engine.tokenizer),
        stop_token_ids=list(engine.eos_token_ids),
    )
