"""Grammar selection: response_format / tool_choice -> GrammarSpec (pure, no xgrammar)."""

from __future__ import annotations

import json

import pytest
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured import (
    json_object_grammar,
    json_schema_grammar,
    no_tool_call_grammar,
    tool_call_grammar,
)
from langchain_ascend.structured.selection import (
    forced_format,
    grammar_spec,
    response_format_grammar,
    warm_up_specs,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [convert_to_openai_tool(add), convert_to_openai_tool(mul)]
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def _spec(**kwargs):
    base = {"response_format": None, "tools": TOOLS, "tool_choice": "auto",
            "parallel_tool_calls": None, "fmt": "hermes", "special_tokens": set()}
    return grammar_spec(**{**base, **kwargs})


def test_response_format_kinds():
    assert response_format_grammar({"type": "json_object"}) == json_object_grammar()
    assert response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}
    ) == json_schema_grammar(SCHEMA)
    for bad in ({"type": "xml"}, {"type": "json_schema"}, "json", None):
        with pytest.raises(InvalidRequestError, match="unsupported response_format"):
            response_format_grammar(bad)


def test_response_format_formats_text_and_a_forced_choice_is_a_call():
    text = {"type": "json_object"}
    assert _spec(response_format=text, tool_choice="auto") == json_object_grammar()
    assert _spec(response_format=text, tool_choice="none") == json_object_grammar()
    assert _spec(response_format=text, tool_choice="required") == _spec(tool_choice="required")
    assert _spec(response_format=text, tool_choice="mul") == _spec(tool_choice="mul")
    with pytest.raises(InvalidRequestError, match="unsupported response_format"):
        _spec(response_format={"type": "xml"}, tool_choice="required")  # still checked


def test_a_text_response_format_is_openais_default_plain_text():
    text = {"type": "text"}
    assert _spec(response_format=text, tool_choice="auto") is None
    assert _spec(response_format=text, tool_choice="none") == _spec(tool_choice="none")
    assert _spec(response_format=text, tool_choice="mul") == _spec(tool_choice="mul")


def test_free_choices_get_no_grammar_and_none_excludes_markers():
    assert _spec(tool_choice="auto") is None
    assert _spec(tool_choice="none", tools=[]) is None
    assert _spec(tool_choice="none", fmt="mistral") == no_tool_call_grammar("mistral")


def test_forced_choices_and_their_parallel_defaults():
    required = _spec(tool_choice="required")
    assert required == tool_call_grammar(TOOLS, fmt="hermes", parallel=True)
    assert _spec(tool_choice="required", parallel_tool_calls=False) == tool_call_grammar(
        TOOLS, fmt="hermes", parallel=False)
    named = _spec(tool_choice="mul")
    assert named == tool_call_grammar(TOOLS, fmt="hermes", tool_name="mul", parallel=False)
    (tag,) = json.loads(named.source)["format"]["tags"]
    assert '"mul"' in tag["begin"]
    assert _spec(tool_choice="mul", parallel_tool_calls=True) == tool_call_grammar(
        TOOLS, fmt="hermes", tool_name="mul", parallel=True)


def test_auto_format_forces_hermes_calls():
    assert forced_format("auto") == "hermes" and forced_format("mistral") == "mistral"
    assert _spec(tool_choice="required", fmt="auto") == _spec(tool_choice="required")


def test_warm_up_specs_are_the_ones_requests_ask_for():
    specs = warm_up_specs(TOOLS, [SCHEMA], fmt="hermes", special_tokens=set())
    assert specs == [
        json_object_grammar(),
        _spec(tool_choice="none"),
        _spec(tool_choice="required"),
        _spec(tool_choice="add"),
        _spec(tool_choice="mul"),
        json_schema_grammar(SCHEMA),
    ]
    assert warm_up_specs([], [], fmt="hermes", special_tokens=set()) == [json_object_grammar()]
