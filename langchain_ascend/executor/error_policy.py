"""``handle_tool_errors`` of :class:`~langchain_ascend.tools.NPUStreamToolExecutor`.

Resolved once, as langgraph's ToolNode reads it, into an :class:`ErrorPolicy`: which
exceptions become an error ``ToolMessage`` and what that message says (by default a text the
model can act on). langgraph interrupts are never caught.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_ascend.errors import (
    InvalidRequestError,
    ToolCallError,
    ToolTimeoutError,
    ToolWorkersExhaustedError,
)
from langchain_ascend.executor.langgraph_names import is_control_flow


def default_error_content(exc: BaseException, name: str) -> str:
    """The message a model reads when a call failed, written so it can fix the call."""
    if isinstance(exc, ToolCallError):
        return f"Error: {exc}. Fix the tool call and try again."
    if isinstance(exc, (ToolTimeoutError, ToolWorkersExhaustedError)):
        return f"Error: {exc}"
    detail = str(exc) or "(no message)"
    return f"Error: tool {name!r} raised {type(exc).__name__}: {detail}"


def _handled_types_of(handler: Callable[..., Any]) -> tuple[type[BaseException], ...]:
    """Exception types a handler accepts, read from its first parameter's annotation."""
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return (Exception,)
    if not params:
        return (Exception,)
    first = params[1] if params[0].name in ("self", "cls") and len(params) == 2 else params[0]
    try:
        hints = typing.get_type_hints(handler)
    except Exception:  # noqa: BLE001 - unresolvable annotation: treat as untyped
        hints = {}
    annotation = hints.get(first.name)
    if annotation is None:
        return (Exception,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
    else:
        members = (annotation,)
    if not all(isinstance(m, type) and issubclass(m, BaseException) for m in members):
        raise InvalidRequestError(
            f"handle_tool_errors callable annotates its error as {annotation!r}; annotate it "
            "with exception types (e.g. `def handler(e: ValueError) -> str`) or leave it bare")
    return tuple(members)


@dataclass(frozen=True)
class ErrorPolicy:
    """What ``handle_tool_errors`` means, resolved once.

    Attributes:
        handled: Exception types turned into an error ToolMessage; others propagate.
        content: Fixed text (``str`` flag), a handler (callable flag) or None for the default
            message from :func:`default_error_content`.
    """

    handled: tuple[type[BaseException], ...]
    content: str | Callable[[BaseException], Any] | None

    def handles(self, exc: BaseException) -> bool:
        """True when ``exc`` becomes a ToolMessage rather than propagating."""
        return not is_control_flow(exc) and isinstance(exc, self.handled)

    def render(self, exc: BaseException, name: str) -> str:
        """Content of the error ToolMessage for ``exc`` raised by tool ``name``."""
        if self.content is None:
            return default_error_content(exc, name)
        if isinstance(self.content, str):
            return self.content
        produced = self.content(exc)
        return produced if isinstance(produced, str) else str(produced)


def error_policy(flag: Any) -> ErrorPolicy:
    """Resolve ``handle_tool_errors`` the way langgraph's ToolNode reads it.

    ``True``: every exception becomes an error message. ``False``: exceptions propagate.
    A ``str``: every exception becomes that text. An exception type or tuple of types: only
    those are caught. A callable: caught when its first parameter's annotation matches (any
    exception when unannotated); its return value is the message.

    Raises:
        InvalidRequestError: ``flag`` is none of these.
    """
    if flag is True:
        return ErrorPolicy((Exception,), None)
    if flag is False or flag is None:
        return ErrorPolicy((), None)
    if isinstance(flag, str):
        return ErrorPolicy((Exception,), flag)
    if isinstance(flag, type) and issubclass(flag, BaseException):
        return ErrorPolicy((flag,), None)
    if isinstance(flag, tuple) and flag and all(
            isinstance(t, type) and issubclass(t, BaseException) for t in flag):
        return ErrorPolicy(flag, None)
    if callable(flag):
        return ErrorPolicy(_handled_types_of(flag), flag)
    raise InvalidRequestError(
        "handle_tool_errors must be a bool, a str, an exception type, a tuple of exception "
        f"types or a callable; got {flag!r}")
