"""A parked hop's tool results, prefilled as they land (``AscendChatModel`` with a session).

When a hop of an agent session ends in tool calls, the chat model parks the session in the
engine (its blocks stay resident, ``engine.core.retention``) and registers a
:class:`LandingPrefill` with the executor's hub (``executor.session_hub``). Then:

* at once, the conversation through the reply and the *opening of the first tool message*
  (the template's tool-response wrapper) is prefilled in the background;
* as each tool finishes, the results that have landed *in call order* (the order the
  template renders them; a result that lands early waits for its predecessors) are
  appended, with the next message's opening, and prefilled in the background while the
  sibling tools run;
* when the last result lands nothing is sent: the next hop's own call then finds all but
  that result and the generation prompt cached.

What is prefilled is the longest common token prefix of two renderings with different
placeholder contents for the next pending result, so it holds only tokens the real next
prompt will start with - if the template is prefix-stable, which is checked by rendering: the
hop's own prompt must be a prefix of the rendering with its reply appended. A template that
is not (one that rewrites earlier turns) falls back to the one-shot prefill of the next call
and the engine counts it (``stats().num_template_fallbacks``). Exactness never rests on the
guess: the engine's prefix cache verifies every block's tokens before reusing it, so the KV
and logits are those of a one-shot prefill of the same conversation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from langchain_ascend.engine.core.kv_cache_manager import common_prefix_length

logger = logging.getLogger(__name__)

_PLACEHOLDERS = ("A", "7")  # two contents that differ in their first character


class LandingPrefill:
    """One parked hop: its conversation, its reply's calls and the results landed so far.

    Args:
        engine: The engine that parked the session (``prefill_session``,
            ``record_tool_latency``, ``note_template_fallback``).
        session_id: The session.
        render: Renders a conversation the way the next call will (same tools, template
            variables) into prompt token ids.
        conversation: The hop's prompt messages.
        reply: The hop's reply (its ``tool_calls`` in call order).
        hop_prompt_ids: The hop's prompt, for the prefix-stability check.
    """

    def __init__(self, engine: Any, session_id: str,
                 render: Callable[[list[BaseMessage]], list[int]],
                 conversation: Sequence[BaseMessage], reply: AIMessage,
                 hop_prompt_ids: Sequence[int]) -> None:
        self.engine = engine
        self.session_id = session_id
        self._render = render
        self._base = [*conversation, reply]
        self._calls = [c for c in reply.tool_calls if c.get("id")]
        self._hop_prompt = list(hop_prompt_ids)
        self._lock = threading.Lock()
        self._landed: dict[str, ToolMessage] = {}
        self._num_sent = -1  # results covered by the last prefill sent (-1: none yet)
        self.stable: bool | None = None
        self.prefilled: list[list[int]] = []
        """Every prefix sent to the engine, in order (for tests and traces)."""

    def start(self) -> None:
        """Prefill the conversation through the first tool message's opening."""
        self._advance()

    def tool_finished(self, call_id: str, name: str, result: Any, seconds: float) -> None:
        """One call finished: learn its latency; prefill the results landed in order."""
        self.engine.record_tool_latency(name, seconds)
        if isinstance(result, ToolMessage):
            with self._lock:
                self._landed[call_id] = result
        self._advance()

    def _advance(self) -> None:
        with self._lock:
            if self.stable is False:
                return
            ready = 0
            for call in self._calls:
                if call["id"] not in self._landed:
                    break
                ready += 1
            if ready <= self._num_sent or ready >= len(self._calls):
                return  # nothing new, or all landed: the next call prefills the rest
            self._num_sent = ready
            messages = self._base + [self._landed[c["id"]] for c in self._calls[:ready]]
            pending = self._calls[ready]
        renderings = [self._render(messages + [ToolMessage(text, tool_call_id=pending["id"],
                                                           name=pending["name"])])
                      for text in _PLACEHOLDERS]
        first, second = renderings
        if self.stable is None:
            self.stable = first[:len(self._hop_prompt)] == self._hop_prompt
            if not self.stable:
                logger.info("session %s: the chat template is not prefix-stable for appended "
                            "tool messages; its results are prefilled one-shot",
                            self.session_id)
                self.engine.note_template_fallback()
                return
        prefix = first[:common_prefix_length(first, second)]
        self.prefilled.append(prefix)
        self.engine.prefill_session(self.session_id, prefix)

