"""Attach a callback handler to every run started inside a ``with`` block, as langchain_core's
``get_usage_metadata_callback()`` does: a ``ContextVar`` registered once with
``register_configure_hook``, so LangChain's callback manager adds the handler it holds to
each run configured in that context (sync, async, nested runnables, threads started with the
context copied, as LangChain's executors do).

Blocks may nest: each nesting depth has a variable of its own (registered on first use, kept
for the process), so an inner block's runs reach the inner and the outer handler. A handler
also passed explicitly (``config={"callbacks": [h]}``) is not added twice.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from langchain_core.tracers.context import register_configure_hook

_DEPTH: ContextVar[int] = ContextVar("langchain_ascend_attached_depth", default=0)
_VARIABLES: list[ContextVar[Any]] = []
_REGISTER = threading.Lock()


def _variable(depth: int) -> ContextVar[Any]:
    """The variable of nesting depth ``depth``, registered as a configure hook once."""
    with _REGISTER:
        while len(_VARIABLES) <= depth:
            variable: ContextVar[Any] = ContextVar(
                f"langchain_ascend_attached_{len(_VARIABLES)}", default=None)
            register_configure_hook(variable, inheritable=True)
            _VARIABLES.append(variable)
        return _VARIABLES[depth]


@dataclass
class Attachment:
    """What :func:`detach` undoes."""

    variable: ContextVar[Any]
    handler_token: Token[Any]
    depth_token: Token[int]


def attach(handler: Any) -> Attachment:
    """Give ``handler`` to every run configured in the current context from now on."""
    depth = _DEPTH.get()
    variable = _variable(depth)
    return Attachment(variable, variable.set(handler), _DEPTH.set(depth + 1))


def detach(attachment: Attachment) -> None:
    """Undo :func:`attach` (in the context it was attached in)."""
    try:
        attachment.variable.reset(attachment.handler_token)
        _DEPTH.reset(attachment.depth_token)
    except ValueError:  # left in another context (an async generator's): clear this one's
        attachment.variable.set(None)
        _DEPTH.set(max(_DEPTH.get() - 1, 0))
