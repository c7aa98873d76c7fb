"""The demo's two local, deterministic tools: ``get_weather`` (three cities, canned) and
``calculator`` (arithmetic through :func:`safe_eval`, never ``eval``)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from langchain_core.tools import BaseTool, tool

_WEATHER = {
    "beijing": "Beijing: 4°C, clear, north wind 25 km/h",
    "shenzhen": "Shenzhen: 23°C, humid, light rain in the evening",
    "shanghai": "Shanghai: 12°C, overcast",
}
_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
}


def safe_eval(expression: str) -> float:
    """Evaluate +-*/%** arithmetic on numbers; anything else raises ValueError."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression element: {type(node).__name__}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return walk(tree)


def build_tools() -> list[BaseTool]:
    """The demo's two local, deterministic tools (the agent adds ``search_docs``)."""

    @tool
    def get_weather(city: str) -> str:
        """Today's weather in a city (Beijing, Shenzhen or Shanghai)."""
        key = city.strip().lower()
        # Like a geocoder, accept a known city inside a longer name ("Beijing, China").
        found = [text for name, text in _WEATHER.items() if name in key]
        if len(found) == 1:
            return found[0]
        return f"no weather data for {city!r}; known: Beijing, Shenzhen, Shanghai"

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression such as '7 * 24'."""
        value = safe_eval(expression)
        return str(int(value)) if float(value).is_integer() else str(value)

    return [get_weather, calculator]
