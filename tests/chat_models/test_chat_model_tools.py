"""Tool calling and structured output through AscendChatModel on a random-weight model.

A random model cannot choose a tool, but forced choices (``tool_choice="required"``, a tool
name, ``with_structured_output``) are guaranteed by constrained decoding, so every sampled reply
must be valid — here for 20 different seeds at temperature 1.
"""

from __future__ import annotations

from typing import Literal

import pytest
from chat_test_tools import get_time, get_weather
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import BaseModel, Field, ValidationError
from typing_extensions import TypedDict

from langchain_ascend.errors import InvalidRequestError

SEEDS = range(20)


class Person(BaseModel):
    """A person."""

    name: str = Field(description="Full name")
    age: int = Field(ge=0, le=150)
    role: Literal["admin", "user", "guest"]
    tags: list[str] = []


def _check_call(call):
    schema = {"get_weather": get_weather, "get_time": get_time}[call["name"]].args_schema
    schema.model_validate(call["args"])
    assert call["id"] and call["type"] == "tool_call"


def test_required_tool_choice_always_gives_valid_calls(tiny_chat, weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="required")
    for seed in SEEDS:
        message = llm.invoke("What's the weather like?", temperature=1.0, seed=seed,
                             max_tokens=64)
        assert message.tool_calls, f"seed {seed}: {message}"
        assert message.invalid_tool_calls == []
        assert message.content == ""
        assert message.response_metadata["finish_reason"] == "tool_calls"
        for call in message.tool_calls:
            _check_call(call)


@pytest.mark.parametrize(
    "choice", ["get_time", {"type": "function", "function": {"name": "get_time"}}])
def test_named_tool_choice_gives_exactly_that_call(tiny_chat, weather_tools, choice):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice=choice)
    for seed in range(5):
        message = llm.invoke("Hi", temperature=1.0, seed=seed, max_tokens=48)
        (call,) = message.tool_calls
        assert call["name"] == "get_time"
        _check_call(call)


def test_streamed_tool_calls_arrive_as_chunks_and_match_invoke(tiny_chat, weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="any")
    expected = llm.invoke("Weather?", temperature=1.0, seed=3, max_tokens=64)
    chunks = list(llm.stream("Weather?", temperature=1.0, seed=3, max_tokens=64))
    assert any(c.tool_call_chunks for c in chunks)
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        (c["name"], c["args"]) for c in expected.tool_calls]
    assert full.response_metadata["finish_reason"] == "tool_calls"


async def test_async_forced_calls_are_valid(tiny_chat, weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="required")
    messages = await llm.abatch(["Weather?"] * 4, temperature=1.0, max_tokens=64)
    for message in messages:
        assert message.tool_calls and not message.invalid_tool_calls
        for call in message.tool_calls:
            _check_call(call)


def test_no_parallel_calls_when_disabled(tiny_chat, weather_tools):
    llm = tiny_chat.bind_tools(weather_tools, tool_choice="required", parallel_tool_calls=False)
    for seed in range(8):
        assert len(llm.invoke("x", temperature=1.0, seed=seed, max_tokens=64).tool_calls) == 1


def test_tool_choice_none_keeps_tools_in_the_prompt_but_never_calls(tiny_chat, weather_tools):
    plain = tiny_chat.invoke("Weather?").usage_metadata["input_tokens"]
    auto = tiny_chat.bind_tools(weather_tools).invoke("Weather?")
    assert auto.usage_metadata["input_tokens"] > plain  # the schemas are in the prompt
    no_calls = tiny_chat.bind_tools(weather_tools, tool_choice="none")
    for seed in range(5):
        reply = no_calls.invoke("Weather?", temperature=1.0, seed=seed, max_tokens=24)
        # Same prompt as with tools (same prefix cache); the reply is plain text.
        assert reply.usage_metadata["input_tokens"] == auto.usage_metadata["input_tokens"]
        assert reply.tool_calls == [] and reply.invalid_tool_calls == []
        assert "<tool_call>" not in reply.content


def test_bad_tool_choice_is_rejected_when_binding(tiny_chat, weather_tools):
    with pytest.raises(InvalidRequestError, match="'get_stock'"):
        tiny_chat.bind_tools(weather_tools, tool_choice="get_stock")
    with pytest.raises(InvalidRequestError, match="unsupported tool_choice"):
        tiny_chat.bind_tools(weather_tools, tool_choice={"type": "function"})
    with pytest.raises(InvalidRequestError, match="no tools are bound"):
        tiny_chat.invoke("x", tool_choice="required")


def test_structured_output_pydantic_is_valid_for_20_seeds(tiny_chat):
    structured = tiny_chat.with_structured_output(Person)
    for seed in SEEDS:
        person = structured.invoke("Describe a person", temperature=1.0, seed=seed,
                                   max_tokens=64)
        assert isinstance(person, Person), f"seed {seed}"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_methods_and_schema_kinds(tiny_chat, method):
    class Movie(TypedDict):
        """A movie."""

        title: str
        year: int

    as_dict = tiny_chat.with_structured_output(Movie, method=method)
    for seed in range(3):
        movie = as_dict.invoke("A film", temperature=1.0, seed=seed, max_tokens=48)
        assert set(movie) == {"title", "year"} and isinstance(movie["year"], int)
    as_model = tiny_chat.with_structured_output(Person, method=method)
    assert isinstance(as_model.invoke("x", temperature=1.0, seed=1, max_tokens=64), Person)


def test_a_schema_whose_root_is_no_object_constrains_the_reply(tiny_chat):
    """An array (or anyOf) root: langchain's conversion kept only its title, so the grammar
    was any JSON (a float came back); function calling needs an object and says so."""
    numbers = {"title": "numbers", "type": "array", "items": {"type": "integer"},
               "maxItems": 3}
    structured = tiny_chat.with_structured_output(numbers)
    for seed in range(3):
        reply = structured.invoke("Some numbers", temperature=1.0, seed=seed, max_tokens=48)
        assert isinstance(reply, list) and all(isinstance(n, int) for n in reply), reply
    with pytest.raises(InvalidRequestError, match="needs an object schema"):
        tiny_chat.with_structured_output(numbers, method="function_calling")


def test_structured_output_streams_parsed_objects(tiny_chat):
    chunks = list(tiny_chat.with_structured_output(Person).stream(
        "x", temperature=1.0, seed=2, max_tokens=64))
    assert chunks and all(isinstance(c, Person) for c in chunks)


def test_json_mode_gives_json_and_include_raw_reports_schema_misses(tiny_chat):
    sampled = tiny_chat.model_copy(update={"temperature": 1.0, "seed": 5, "max_tokens": 40})
    raw_json = sampled.with_structured_output(Person, method="json_mode", include_raw=True)
    result = raw_json.invoke("x")
    assert isinstance(result["raw"], AIMessage)
    # json_mode only promises *some* JSON object; a random model does not follow the schema.
    if result["parsed"] is None:
        assert result["parsing_error"] is not None
    as_dict = tiny_chat.with_structured_output({"title": "Anything", "type": "object",
                                                "properties": {}}, method="json_mode")
    assert isinstance(as_dict.invoke("x", temperature=1.0, seed=5, max_tokens=40), dict)


def test_json_mode_needs_no_schema_and_a_bad_schema_is_a_typed_error(tiny_chat):
    anything = tiny_chat.with_structured_output(method="json_mode")
    assert isinstance(anything.invoke("x", temperature=1.0, seed=5, max_tokens=40), dict)
    with pytest.raises(InvalidRequestError, match="method='json_schema'.* needs a schema"):
        tiny_chat.with_structured_output(None)
    with pytest.raises(InvalidRequestError, match="42 is not a schema"):
        tiny_chat.with_structured_output(42)


def test_budget_closed_output_cut_reports_what_the_guard_closed_as_cut(tiny_chat):
    """The random model's strings never end on their own: the budget guard closes them."""
    loose = tiny_chat.model_copy(update={"max_tokens": 48})
    strict = loose.model_copy(update={"budget_closed_output": "cut"})
    (call,) = loose.bind_tools([get_weather], tool_choice="get_weather").invoke("x").tool_calls
    cut = strict.bind_tools([get_weather], tool_choice="get_weather").invoke("x")
    assert cut.tool_calls == [] and cut.response_metadata["finish_reason"] == "length"
    (entry,) = cut.invalid_tool_calls
    assert entry["name"] == call["name"] and "closed early to fit max_tokens=48" in entry["error"]
    assert isinstance(loose.with_structured_output(Person).invoke("x"), Person)
    raw = strict.with_structured_output(Person, include_raw=True).invoke("x")
    assert raw["parsed"] is None and "closed early" in str(raw["parsing_error"])
    assert Person.model_validate_json(raw["raw"].content)  # valid, but shortened


def test_include_raw_with_a_guaranteed_schema(tiny_chat):
    sampled = tiny_chat.model_copy(update={"temperature": 1.0, "seed": 4, "max_tokens": 64})
    result = sampled.with_structured_output(Person, include_raw=True).invoke("x")
    assert isinstance(result["parsed"], Person) and result["parsing_error"] is None
    assert Person.model_validate_json(result["raw"].content) == result["parsed"]
    assert list(Person.model_fields)[:2] == ["name", "age"]
    assert result["raw"].content.startswith('{"name": ')  # fields come in declared order


def test_unknown_structured_output_method_is_a_typed_error(tiny_chat):
    with pytest.raises(InvalidRequestError, match="unknown method"):
        tiny_chat.with_structured_output(Person, method="xml")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Person.model_validate({"name": "x"})  # sanity: the schema really is strict


def test_tool_call_ids_repeat_for_the_same_conversation(tiny_chat, weather_tools):
    bound = tiny_chat.bind_tools(weather_tools, tool_choice="get_weather")
    first = bound.invoke([HumanMessage("Weather in Paris?")], max_tokens=60)
    again = bound.invoke([HumanMessage("Weather in Paris?")], max_tokens=60)
    other = bound.invoke([HumanMessage("Weather in Rome?")], max_tokens=60)
    assert first.tool_calls[0]["id"] == again.tool_calls[0]["id"]
    assert first.tool_calls[0]["id"] != other.tool_calls[0]["id"]
