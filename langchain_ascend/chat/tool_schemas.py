"""Tools and output schemas as the JSON schemas the prompt and the grammar use.

LangChain's ``convert_to_openai_tool`` / ``convert_to_json_schema`` inline a pydantic
class's nested models, which cannot be done for a model that refers to itself (a tree node
with ``children: list["Node"]``, a linked list): langchain then drops the reference
(``"items": {}``), so a call or a structured reply may put anything there and the parsed
class fails to validate. For such a class the parameters here are pydantic's own schema,
its ``$defs`` and ``$ref`` kept (the grammar follows references); every other tool converts
exactly as langchain converts it. No torch.
"""

from __future__ import annotations

from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

_DEFS_PREFIX = "#/$defs/"


def openai_tool(tool: Any) -> dict[str, Any]:
    """``convert_to_openai_tool(tool)``; a pydantic class that refers to itself keeps its
    references (module docstring).

    Raises:
        Whatever ``convert_to_openai_tool`` raises for something that is not a tool.
    """
    converted = convert_to_openai_tool(tool)
    own = _self_referencing_schema(tool)
    if own is not None:
        converted["function"]["parameters"] = own
    return converted


_TOOL_KEYS = frozenset({"name", "parameters", "input_schema", "toolSpec", "function"})
"""Keys of a tool dict (OpenAI, Anthropic, Bedrock), which no JSON schema's root has."""

_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def schema_problem(schema: Any, where: str = "parameters") -> str | None:
    """What makes ``schema`` no JSON schema a tool's parameters can be, or None: a schema is
    a dict (or a bool); its ``type`` a JSON type or a list of them, ``properties`` a dict of
    schemas, ``required`` a list of strings, ``items`` a schema, ``enum`` a list. Checked at
    the call (OpenAI answers such a tool with a 400) rather than never (``tool_choice="auto"``
    compiles no grammar) or as the grammar compiler's message (a forced call). Pure."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where} must be a JSON schema object, got {type(schema).__name__} {schema!r}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    bad = [k for k in kinds if not isinstance(k, str) or k not in _JSON_TYPES]
    if bad:
        return f"{where}.type={kind!r} is not a JSON type (one of {sorted(_JSON_TYPES)})"
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return f"{where}.properties must be an object of schemas, got {properties!r}"
    required = schema.get("required", [])
    if not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"{where}.required must be a list of property names, got {required!r}"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}.enum must be a list, got {schema['enum']!r}"
    nested = [(f"{where}.properties.{name}", sub) for name, sub in properties.items()]
    items = schema.get("items")
    if isinstance(items, list):  # a tuple's items (drafts 4-7; pydantic 1 writes them)
        nested += [(f"{where}.items[{i}]", sub) for i, sub in enumerate(items)]
    elif "items" in schema:
        nested.append((f"{where}.items", items))
    for path, sub in nested:
        problem = schema_problem(sub, path)
        if problem:
            return problem
    return None


def object_root(schema: dict[str, Any]) -> bool:
    """Whether a JSON schema describes an object at its root (what a tool's arguments are)."""
    return schema.get("type") == "object" or "properties" in schema


def arguments_like(schema: dict[str, Any]) -> bool:
    """Whether a schema can be a tool's arguments: an object, or no root type at all (a tool
    without parameters); not an array, a union or an enum."""
    return object_root(schema) or not ({"type", "anyOf", "oneOf", "enum", "items"} & set(schema))


def json_schema(schema: Any) -> dict[str, Any]:
    """``convert_to_json_schema(schema)`` (title, description, the object schema); a pydantic
    class that refers to itself keeps its references (module docstring); a JSON schema dict
    whose root is no object (an array, ``anyOf``, an enum) as it is: langchain keeps only its
    title of it, and the reply was then any JSON at all."""
    if (isinstance(schema, dict) and not object_root(schema)
            and not _TOOL_KEYS & set(schema) and schema.get("type") != "function"):
        return dict(schema)
    converted = convert_to_json_schema(schema)
    own = _self_referencing_schema(schema)
    if own is None:
        return converted
    return {key: converted[key] for key in ("title", "description") if key in converted} | own


def _self_referencing_schema(tool: Any) -> dict[str, Any] | None:
    """The object schema of a pydantic class whose definitions refer to themselves, its
    ``$defs`` attached, or None for anything else (pure function of the class)."""
    if not (isinstance(tool, type) and is_basemodel_subclass(tool)
            and hasattr(tool, "model_json_schema")):  # pydantic 2 (a v1 class converts as is)
        return None
    own = tool.model_json_schema()
    defs = own.get("$defs") or {}
    if not _has_cycle(defs):
        return None
    body = own
    if isinstance(own.get("$ref"), str) and own["$ref"].startswith(_DEFS_PREFIX):
        body = defs.get(own["$ref"][len(_DEFS_PREFIX):], own)  # the class itself, a def
    params = {key: value for key, value in body.items()
              if key not in ("title", "description", "$defs", "$ref")}
    params["$defs"] = defs
    return params


def _refs(node: Any) -> set[str]:
    """Names of the ``$defs`` entries ``node`` refers to, at any depth."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
                found.add(ref[len(_DEFS_PREFIX):])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _has_cycle(defs: dict[str, Any]) -> bool:
    """Whether the definitions' references form a cycle (depth-first, colouring)."""
    edges = {name: _refs(body) for name, body in defs.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str) -> bool:
        state[name] = 1
        for nxt in edges.get(name, ()):
            if state.get(nxt) == 1 or (nxt in edges and nxt not in state and visit(nxt)):
                return True
        state[name] = 2
        return False

    return any(name not in state and visit(name) for name in edges)
