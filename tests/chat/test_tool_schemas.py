"""Tools and output schemas as JSON schemas: a pydantic class that refers to itself keeps its
references, every other tool converts exactly as langchain converts it."""

from __future__ import annotations

from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel
from pydantic.v1 import BaseModel as BaseModelV1

from langchain_ascend.chat.tool_schemas import json_schema, openai_tool


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
