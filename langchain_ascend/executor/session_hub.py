"""Where an agent's tool executor meets the engine that parked the agent's session.

No engine, no LangChain model here: a process-wide :class:`SessionHub` maps a session id to
the listener a chat model registered when the session's hop ended in tool calls (see
``chat.session_prefill``). The executor reports each call as it finishes (its latency, its
``ToolMessage``); the listener feeds the engine's latency estimate and prefills the result in
the background while the sibling tools still run.

A run names its session through its ``RunnableConfig``: ``metadata["ascend_session_id"]``
(what ``create_ascend_agent`` sets), ``configurable["ascend_session_id"]``, or langgraph's
``configurable["thread_id"]`` / ``metadata["thread_id"]``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

logger = logging.getLogger(__name__)

SESSION_KEY = "ascend_session_id"
"""The metadata / configurable key naming a run's agent session."""


class ToolListener(Protocol):
    """What a parked hop does as its tools finish."""

    def tool_finished(self, call_id: str, name: str, result: Any, seconds: float) -> None:
        """One call finished after ``seconds`` with ``result`` (a ``ToolMessage``, or None
        when it failed)."""


def session_of(config: Mapping[str, Any] | None) -> str | None:
    """The agent session a run's config names, or None."""
    if not config:
        return None
    metadata = config.get("metadata") or {}
    configurable = config.get("configurable") or {}
    for source, key in ((metadata, SESSION_KEY), (configurable, SESSION_KEY),
                        (configurable, "thread_id"), (metadata, "thread_id")):
        value = source.get(key)
        if isinstance(value, str) and value:
            return value
    return None


class SessionHub:
    """Session id -> the listener of its parked hop. Thread-safe; a listener's failure is
    logged and never reaches the tools."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, ToolListener] = {}

    def park(self, session_id: str, listener: ToolListener) -> None:
        with self._lock:
            self._listeners[session_id] = listener

    def resume(self, session_id: str) -> None:
        """The session's next hop started (or it ended): stop listening."""
        with self._lock:
            self._listeners.pop(session_id, None)

    def listener(self, session_id: str) -> ToolListener | None:
        with self._lock:
            return self._listeners.get(session_id)

    def tool_finished(self, session_id: str | None, call_id: str, name: str, result: Any,
                      seconds: float) -> None:
        if session_id is None:
            return
        listener = self.listener(session_id)
        if listener is None:
            return
        try:
            listener.tool_finished(call_id, name, result, seconds)
        except Exception:  # noqa: BLE001 - only an optimisation: the tools go on
            logger.warning("session %s: handing a tool result to the engine failed",
                           session_id, exc_info=True)


HUB = SessionHub()
"""The process's hub (chat models park on it, executors report to it)."""
