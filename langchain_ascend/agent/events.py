"""What :meth:`AscendAgent.stream` / ``astream`` yield: one small typed record per event."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from langchain_core.messages import BaseMessage

#: ``"message_chunk"``: a piece of the model's reply, as the model generates it;
#: ``"message"``: a hop's complete reply (an ``AIMessage``, tool calls parsed, usage attached);
#: ``"tool_result"``: one ``ToolMessage`` of that hop (errors included, ``status="error"``);
#: ``"final"``: the run's last ``AIMessage`` (the answer, or the hop-limit notice), with
#: ``output`` the dict ``invoke`` returns.
EventKind = Literal["message_chunk", "message", "tool_result", "final"]


@dataclasses.dataclass(frozen=True)
class AgentEvent:
    """One event of an agent run, in the order things happened.

    A run with two hops streams::

        message_chunk* (hop 1)  message (hop 1)  tool_result+ (hop 1)
        message_chunk* (hop 2)  message (hop 2)  final (hop 2)

    Attributes:
        kind: See :data:`EventKind`.
        hop: The model call the event belongs to, counted from 1.
        message: An ``AIMessageChunk`` (``message_chunk``), an ``AIMessage`` (``message``,
            ``final``) or a ``ToolMessage`` (``tool_result``).
        output: Only on ``final``: ``{"messages": [...]}``, the same dict ``invoke`` returns.
    """

    kind: EventKind
    hop: int
    message: BaseMessage
    output: dict[str, Any] | None = None
