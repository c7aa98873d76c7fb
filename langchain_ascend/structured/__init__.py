"""Constrained decoding: grammar specs (pure) and the xgrammar backend (loaded lazily).

``grammars`` builds :class:`GrammarSpec` objects for JSON schemas, ``json_mode`` and forced
tool calls; ``selection`` picks a request's spec from ``response_format`` / ``tool_choice``;
``xgrammar_backend`` (imports torch + xgrammar) compiles them per tokenizer and
provides the engine's ``TokenConstraint``.
"""

from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.structured.grammars import (
    GrammarSpec,
    json_object_grammar,
    json_schema_grammar,
    no_tool_call_grammar,
    select_tools,
    tool_call_grammar,
)

__all__ = [
    "GrammarSpec",
    "json_object_grammar",
    "json_schema_grammar",
    "no_tool_call_grammar",
    "select_tools",
    "special_tokens_of",
    "tool_call_grammar",
]
