"""``tools.imports``: the agent's tools named by import path in the config file.

``"package.module:name"`` (or ``"package.module.name"``) names a LangChain tool, a plain
function (made a tool with ``@tool``, its docstring the description) or a list of them.
Each entry is imported when the agent is built; any failure is a
:class:`~langchain_ascend.config.ConfigError` naming ``tools.imports[i]`` and why.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool

from langchain_ascend.config.source import ConfigError


def split_path(path: str) -> tuple[str, str]:
    """``"a.b:c"`` / ``"a.b.c"`` -> ``("a.b", "c")``."""
    if ":" in path:
        module, _, name = path.partition(":")
    else:
        module, _, name = path.rpartition(".")
    return module, name


def as_tools(value: Any, where: str) -> list[BaseTool]:
    """A tool, a function or a list of them as tools.

    Raises:
        ConfigError: Something else, naming ``where``.
    """
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    tools = []
    for item in items:
        if isinstance(item, BaseTool):
            tools.append(item)
        elif callable(item) and not isinstance(item, type):
            tools.append(as_tool(item))
        else:
            raise ConfigError.one(f"{type(item).__name__} {item!r} is not a tool or a "
                                  "function", path=where)
    return tools


def import_tools(paths: Sequence[str] | None) -> list[BaseTool]:
    """The tools ``tools.imports`` names, in order.

    Raises:
        ConfigError: A module that cannot be imported, a missing name, or an object that
            is not a tool; the path is ``tools.imports[i]``.
    """
    tools: list[BaseTool] = []
    for i, path in enumerate(paths or ()):
        where = f"tools.imports[{i}]"
        module_name, name = split_path(path)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ConfigError.one(f"cannot import module {module_name!r} of {path!r}: {error}",
                                  path=where) from error
        if not hasattr(module, name):
            raise ConfigError.one(f"module {module_name!r} has no {name!r} (from {path!r})",
                                  path=where)
        tools.extend(as_tools(getattr(module, name), where))
    return tools
