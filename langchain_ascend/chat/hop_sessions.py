"""An ``AscendChatModel`` call's agent session: which one, and what its hop's end does.

* :func:`hop_session` takes ``session_id`` / ``session_retention`` out of the call's kwargs
  (or the instance's ``session_id``, or the run's metadata: ``executor.session_hub.session_of``);
* :class:`HopCall` runs the engine call with ``session_id=`` (the hub stops listening for the
  previous hop's tools); at its end (:meth:`HopCall.end`) a reply with tool calls parks the session in the engine (TTL from the
  tools' measured latency, or the call's ``session_retention``) and registers a
  :class:`~langchain_ascend.chat.session_prefill.LandingPrefill`; a reply without calls ends
  the session's retention (its blocks stay in the ordinary LRU cache).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel

from langchain_ascend.chat.prepare import build_prompt
from langchain_ascend.chat.results import forced_call_cut
from langchain_ascend.chat.session_prefill import LandingPrefill
from langchain_ascend.engine.core.retention import parse_retention
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.executor.session_hub import HUB, session_of

SESSION_KWARGS = ("session_id", "session_retention")
"""Call arguments naming the session (taken out before the request is prepared)."""


class SessionFields(BaseModel):
    """Which agent session a chat model's calls belong to, and what a parked hop does."""

    session_id: str | None = None
    """The agent session of this model's calls (also per call / ``bind``; else the run's
    ``metadata["ascend_session_id"]``, set by ``create_ascend_agent``, or langgraph's
    ``thread_id``): a hop ending in tool calls keeps its KV blocks while the tools run and
    their results are prefilled as they land (``chat.hop_sessions``; per call
    ``session_retention="in_memory"`` or ``"5m"``). Without one, calls work as before."""

    prefill_tool_results: bool = True
    """With a session: prefill each tool result in the background as its tool finishes."""


@dataclass(frozen=True)
class HopSession:
    """One call's session: its id and an explicit TTL (None: estimate from the tools)."""

    session_id: str
    ttl_s: float | None = None


def hop_session(kwargs: dict[str, Any], default: str | None,
                metadata: Mapping[str, Any] | None) -> HopSession | None:
    """The call's session, popping :data:`SESSION_KWARGS` from ``kwargs``.

    Raises:
        InvalidRequestError: A session id that is not a non-empty string, a bad retention.
    """
    session_id = kwargs.pop("session_id", None)
    retention = kwargs.pop("session_retention", None)
    if session_id is None:
        session_id = default
    if session_id is None and metadata:
        session_id = session_of({"metadata": metadata})
    if session_id is None:
        return None
    if not isinstance(session_id, str) or not session_id:
        raise InvalidRequestError(f"session_id must be a non-empty string, got {session_id!r}")
    return HopSession(session_id, parse_retention(retention))


def open_hop(fields: SessionFields, prepare: Callable[..., Any], settings: Any,
             engine_for: Callable[[str], Any], messages: list[BaseMessage], stop: Any,
             kwargs: dict[str, Any], run_manager: Any) -> HopCall:
    """One ``AscendChatModel`` call with its session: the session arguments leave
    ``kwargs``, then ``prepare(messages, stop, kwargs)`` renders it; later renderings of the
    conversation (tool results as they land) use the same arguments."""
    session = hop_session(kwargs, fields.session_id, getattr(run_manager, "metadata", None))

    def render(conversation: list[BaseMessage]) -> list[int]:
        return build_prompt(conversation, kwargs, settings, engine_for).token_ids

    return HopCall(prepare(messages, stop, kwargs), session, messages, render,
                   fields.prefill_tool_results)


class HopCall:
    """A prepared call and what its end does to its session (nothing without one)."""

    def __init__(self, prepared: Any, session: HopSession | None,
                 messages: list[BaseMessage], render: Callable[[list[BaseMessage]], list[int]],
                 prefill_results: bool) -> None:
        self.prepared = prepared
        self.session = session
        self._messages = messages
        self._render = render
        self._prefill_results = prefill_results
        self._finish_reason: str | None = None  # a streamed reply's, once it ended
        if session is not None:  # the previous hop's tools are done
            HUB.resume(session.session_id)

    def _engine_kwargs(self) -> dict[str, Any]:
        return {} if self.session is None else {"session_id": self.session.session_id}

    def generate(self) -> Any:
        p = self.prepared
        return p.engine.generate(p.prompt_token_ids, p.params, **self._engine_kwargs())

    async def agenerate(self) -> Any:
        p = self.prepared
        return await p.engine.agenerate(p.prompt_token_ids, p.params, **self._engine_kwargs())

    def stream(self) -> Any:
        p = self.prepared
        deltas = p.engine.stream(p.prompt_token_ids, p.params, **self._engine_kwargs())
        try:
            for delta in deltas:
                self._note(delta)
                yield delta
        finally:
            deltas.close()

    async def astream(self) -> Any:
        p = self.prepared
        deltas = p.engine.astream(p.prompt_token_ids, p.params, **self._engine_kwargs())
        try:
            async for delta in deltas:
                self._note(delta)
                yield delta
        finally:
            await deltas.aclose()

    def _note(self, delta: Any) -> None:
        """Remember how a streamed reply ended (a forced call cut at ``max_tokens`` is no
        call: ``chat.results``)."""
        if delta.finished and delta.output is not None:
            self._finish_reason = delta.output.finish_reason

    def finish(self, result: Any) -> Any:
        """End the hop with its ``ChatResult``; the reply's
        ``response_metadata["tool_time_prefills"]`` lists the background prefills that fed
        it (``[{"start_ago", "end_ago", "tokens"}]``, seconds before the reply ended)."""
        if self.session is not None:
            message = result.generations[0].message
            spans = self.prepared.engine.take_background_spans(self.session.session_id)
            if spans:
                now = time.monotonic()
                message.response_metadata["tool_time_prefills"] = [
                    {"start_ago": now - start, "end_ago": now - end, "tokens": tokens}
                    for start, end, tokens in spans]
            self.end(message)
        return result

    async def afinish(self, result: Any) -> Any:
        """:meth:`finish` off the event loop (it renders the conversation)."""
        if self.session is None:
            return result
        return await asyncio.to_thread(self.finish, result)

    def finish_stream(self, assembler: Any) -> None:
        """End a streamed hop with the calls its assembler parsed (none when a forced call
        was cut at ``max_tokens``: nothing will run, so the session is not parked)."""
        if self.session is not None:
            cut = forced_call_cut(self.prepared, self._finish_reason)
            calls = [] if cut else [c.to_tool_call() for c in assembler.calls if c.valid]
            self.end(AIMessage(content=assembler.content, tool_calls=calls))

    def end(self, reply: BaseMessage) -> None:
        """Park the session while the reply's tools run (or release it: no tool calls)."""
        assert self.session is not None
        session, engine = self.session, self.prepared.engine
        calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        if not calls:
            engine.release_session(session.session_id)
            return
        ttl = engine.park_session(session.session_id, [c["name"] for c in calls],
                                  ttl_s=session.ttl_s)
        if ttl is None or not self._prefill_results:
            return
        assert isinstance(reply, AIMessage)
        landing = LandingPrefill(engine, session.session_id, self._render, self._messages,
                                 reply, self.prepared.prompt_token_ids)
        HUB.park(session.session_id, landing)
        landing.start()
