"""langgraph's names the executor recognises, looked up lazily (langgraph is optional: without
it they are simply not recognised)."""

from __future__ import annotations

import functools
import types
from typing import Any


@functools.lru_cache(maxsize=1)
def langgraph_names() -> types.SimpleNamespace | None:
    """langgraph's injection markers and control-flow types, or None when not installed."""
    try:
        from langgraph.errors import GraphBubbleUp
        from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
        from langgraph.types import Command, Send
    except ImportError:
        return None
    return types.SimpleNamespace(
        InjectedState=InjectedState, InjectedStore=InjectedStore, ToolRuntime=ToolRuntime,
        Command=Command, Send=Send, GraphBubbleUp=GraphBubbleUp,
    )


def is_control_flow(exc: BaseException) -> bool:
    """True for langgraph's interrupt / parent-command signals, which must always propagate."""
    lg = langgraph_names()
    return lg is not None and isinstance(exc, lg.GraphBubbleUp)


def is_command(value: Any) -> bool:
    """True when ``value`` is a langgraph ``Command``."""
    lg = langgraph_names()
    return lg is not None and isinstance(value, lg.Command)
