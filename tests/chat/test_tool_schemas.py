"""Tools and output schemas as JSON schemas: a pydantic class that refers to itself keeps its
references, every other tool converts exactly as langchain converts it; parameters that are
no JSON schema are refused at the call, naming the place."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel
from pydantic.v1 import BaseModel as BaseModelV1

from langchain_ascend.chat.messages import to_template_tools
from langchain_ascend.chat.tool_schemas import (
    arguments_like,
    json_schema,
    openai_tool,
    schema_problem,
)
from langchain_ascend.errors import InvalidRequestError


class Node(BaseModel):
    """A tree node."""

    value: int
    children: list[Node] = []


class Tree(BaseModel):
    """A named tree."""

    name: str
    root: Node


class Ping(BaseModel):
    """A ping that refers to a pong."""

    pong: Pong | None = None


class Pong(BaseModel):
    """A pong that refers to a ping."""

    ping: Ping | None = None


class Weather(BaseModel):
    """Weather in a city."""

    city: str
    unit: str = "celsius"


def _refs(node):
    if isinstance(node, dict):
        found = [node["$ref"]] if "$ref" in node else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_a_self_referencing_class_keeps_its_references():
    tool = openai_tool(Node)
    assert (tool["function"]["name"], tool["function"]["description"]) == ("Node", "A tree node.")
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["value"]
    assert params["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert set(params["$defs"]) == {"Node"}
    # langchain's own conversion drops the reference: anything would do as a child
    assert convert_to_openai_tool(Node)["function"]["parameters"]["properties"]["children"][
        "items"] == {}


def test_classes_that_refer_to_each_other_or_hold_a_recursive_one_keep_theirs():
    for cls in (Tree, Ping):
        params = openai_tool(cls)["function"]["parameters"]
        defs = params["$defs"]
        assert all(ref.removeprefix("#/$defs/") in defs for ref in _refs(params)), cls
        assert _refs(params), cls
    schema = json_schema(Tree)
    assert (schema["title"], schema["description"]) == ("Tree", "A named tree.")
    assert schema["properties"]["root"] == {"$ref": "#/$defs/Node"} and "$defs" in schema


class WeatherV1(BaseModelV1):
    """Weather in a city (a pydantic 1 class)."""

    city: str


def test_every_other_tool_converts_as_langchain_converts_it():
    weather_dict = {"type": "function", "function": {
        "name": "lookup", "description": "Look up a word.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}
    for tool in (Weather, weather_dict, WeatherV1):
        assert openai_tool(tool) == convert_to_openai_tool(tool)
    for schema in (Weather, WeatherV1):
        assert json_schema(schema) == convert_to_json_schema(schema)


@pytest.mark.parametrize("parameters, said", [
    ({"type": "nonsense"}, "parameters.type='nonsense' is not a JSON type"),
    ({"type": "object", "properties": 5}, "parameters.properties must be an object"),
    ({"type": "object", "required": "city"}, "parameters.required must be a list"),
    ({"type": "object", "properties": {"a": {"type": "strng"}}},
     "parameters.properties.a.type='strng'"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": 5}}},
     "parameters.properties.a.items must be a JSON schema object"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "int"}]}}},
     "parameters.properties.a.items[0].type='int'"),
    ([], "parameters must be a JSON schema object"),
])
def test_a_tool_whose_parameters_are_no_schema_is_refused_naming_the_place(parameters, said):
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(InvalidRequestError, match=re.escape(said)):
        to_template_tools([tool])


def test_real_schemas_pass_the_check():
    class Item(BaseModel):
        name: str
        tags: list[str] = []
        kind: Literal["a", "b"] | None = None

    class Pair(BaseModelV1):
        pair: tuple[int, str]  # pydantic 1: "items" is a list of schemas

    for tool in (Item, Pair, {"type": "function", "function": {"name": "g", "parameters": {
            "type": ["object", "null"], "properties": {"x": True, "y": {"enum": [1, "2"]}}}}}):
        assert schema_problem(to_template_tools([tool])[0]["function"]["parameters"]) is None


def test_tool_dicts_of_other_providers_convert_as_langchain_converts_them():
    """Only a JSON schema is taken as it is: an Anthropic tool dict (``input_schema``) or an
    OpenAI function without parameters converts as langchain converts it."""
    anthropic = {"name": "get_weather", "description": "w", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    assert json_schema(anthropic) == convert_to_json_schema(anthropic)
    assert json_schema(anthropic)["properties"] == {"city": {"type": "string"}}
    assert arguments_like(json_schema({"name": "ping", "description": "p"}))
    assert not arguments_like(json_schema({"title": "n", "type": "array", "items": {}}))
