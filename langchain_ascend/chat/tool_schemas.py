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


def json_schema(schema: Any) -> dict[str, Any]:
    """``convert_to_json_schema(schema)`` (title, description, the object schema); a pydantic
    class that refers to itself keeps its references (module docstring)."""
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
