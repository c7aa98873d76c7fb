"""``AscendAgent``: the model -> tools -> model loop as one LangChain ``Runnable``.

The run's state lives in :class:`~langchain_ascend.agent.hops.AgentRun`; this module holds
the four drivers (``invoke``, ``ainvoke``, ``stream``, ``astream``). ``batch`` / ``abatch``
are ``Runnable``'s: one independent run per input, run concurrently (threads / tasks, bounded
by the config's ``max_concurrency``), so an ``AscendChatModel`` engine batches their hops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages import message_chunk_to_message as to_message
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
    patch_config,
)

from langchain_ascend.agent.events import AgentEvent
from langchain_ascend.agent.hops import AgentRun, hop_config, run_session
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.executor.session_hub import HUB


class AscendAgent(Runnable[Any, dict[str, Any]]):
    """A tool-calling agent: the model answers or calls tools, the executor runs the calls in
    parallel, their ``ToolMessage``\\ s (errors included) go back to the model, until a reply
    has no tool calls or ``max_hops`` model calls were made. Build it with
    :func:`~langchain_ascend.agent.create_ascend_agent`.

    Input: a string, a list of messages, or ``{"messages": [...], ...}`` (other keys are kept,
    and tools with ``InjectedState`` can read them).

    Output of ``invoke`` / ``batch`` (and the ``output`` of the last streamed event):
    ``{"messages": [...]}`` — the input messages, each hop's ``AIMessage`` and
    ``ToolMessage``\\ s, and the final ``AIMessage`` last (``output["messages"][-1]``). The
    system prompt is sent on every model call but not stored in the messages, so an output's
    messages plus a new human turn are the next run's input. When the model still calls tools
    at its last allowed hop, those calls are run (the transcript stays valid) and the final
    message is a notice with ``response_metadata["finish_reason"] == "max_hops"``.

    ``stream`` / ``astream`` yield :class:`~langchain_ascend.agent.events.AgentEvent`\\ s: the
    model's chunks as they are generated, each hop's complete reply, the hop's tool results
    (yielded together when the hop's executor run returns, in call order), and ``final``.

    Callbacks: the agent is one chain run; every model call and executor run is its child,
    with ``metadata["agent_hop"]`` set to the hop number.

    Sessions: every run is one agent session (``metadata["ascend_session_id"]``: the config's
    own, else a fresh id per run), so an ``AscendChatModel`` engine keeps the run's KV blocks
    while its tools run and prefills their results as they land (``executor.session_hub``).
    """

    def __init__(self, *, models: Sequence[Runnable[Any, Any]], executor: Runnable[Any, Any],
                 system_prompt: str | None = None, name: str = "ascend_agent") -> None:
        """
        Args:
            models: The model of each hop, ``models[hop - 1]`` (tools bound, each hop's tool
                choice); ``len(models)`` is the hop limit.
            executor: Runs a hop's tool calls; gets ``{"messages": [...]}`` whose last message
                holds them, returns their ``ToolMessage``\\ s (``NPUStreamToolExecutor``'s
                contract).
            system_prompt: Sent first on every model call.
            name: The run name in traces.
        """
        if not models:
            raise InvalidRequestError("an agent needs at least one hop (max_hops >= 1)")
        self.models = tuple(models)
        self.executor = executor
        self.system_prompt = system_prompt
        self.name = name

    @property
    def max_hops(self) -> int:
        """The most model calls one run makes."""
        return len(self.models)

    def __repr__(self) -> str:
        return (f"AscendAgent(max_hops={self.max_hops}, executor={self.executor!r}, "
                f"system_prompt={self.system_prompt!r:.40})")

    def _start(self, value: Any) -> AgentRun:
        return AgentRun(value, models=self.models, system_prompt=self.system_prompt,
                        messages_key=getattr(self.executor, "messages_key", "messages"))

    # ------------------------------------------------------------------ invoke

    def invoke(self, input: Any, config: RunnableConfig | None = None,
               **kwargs: Any) -> dict[str, Any]:
        """Run the agent to its final message; returns ``{"messages": [...]}``."""
        return self._call_with_config(self._run, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> dict[str, Any]:
        """Async :meth:`invoke`: the model's ``ainvoke`` and the executor's ``ainvoke``."""
        return await self._acall_with_config(self._arun, input, config)

    def _run(self, value: Any, run_manager: CallbackManagerForChainRun,
             config: RunnableConfig) -> dict[str, Any]:
        session = run_session(config)
        run = self._start(value)
        try:
            while not run.done:
                hop, model, prompt = run.model_call()
                step_config = hop_config(config, hop, session)
                if run.add_reply(model.invoke(prompt, step_config)):
                    run.add_tool_output(self.executor.invoke(run.tools_input(), step_config))
        finally:
            HUB.resume(session)
        return run.output()

    async def _arun(self, value: Any, run_manager: AsyncCallbackManagerForChainRun,
                    config: RunnableConfig) -> dict[str, Any]:
        session = run_session(config)
        run = self._start(value)
        try:
            while not run.done:
                hop, model, prompt = run.model_call()
                step_config = hop_config(config, hop, session)
                if run.add_reply(await model.ainvoke(prompt, step_config)):
                    output = await self.executor.ainvoke(run.tools_input(), step_config)
                    run.add_tool_output(output)
        finally:
            HUB.resume(session)
        return run.output()

    # ------------------------------------------------------------------ stream

    def stream(  # type: ignore[override]
            self, input: Any, config: RunnableConfig | None = None,
            **kwargs: Any) -> Iterator[AgentEvent]:
        """Run the agent, yielding :class:`AgentEvent`\\ s as they happen (see the class doc)."""
        config = ensure_config(config)
        run_manager = get_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None))
        child_config = patch_config(config, callbacks=run_manager.get_child())
        session = run_session(config)
        try:
            run = self._start(input)
            while not run.done:
                hop, model, prompt = run.model_call()
                step_config = hop_config(child_config, hop, session)
                chunks: list[BaseMessage] = []
                for chunk in model.stream(prompt, step_config):
                    chunks.append(chunk)
                    yield AgentEvent("message_chunk", hop, chunk)
                reply = join_chunks(chunks)
                needs_tools = run.add_reply(reply)
                yield AgentEvent("message", hop, reply)
                if needs_tools:
                    output = self.executor.invoke(run.tools_input(), step_config)
                    for message in run.add_tool_output(output):
                        yield AgentEvent("tool_result", hop, message)
            result = run.output()
        except BaseException as exc:
            run_manager.on_chain_error(exc)
            raise
        finally:
            HUB.resume(session)
        run_manager.on_chain_end(result)
        assert run.final is not None
        yield AgentEvent("final", run.hop, run.final, result)

    async def astream(  # type: ignore[override]
            self, input: Any, config: RunnableConfig | None = None,
            **kwargs: Any) -> AsyncIterator[AgentEvent]:
        """Async :meth:`stream`."""
        config = ensure_config(config)
        run_manager = await get_async_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None))
        child_config = patch_config(config, callbacks=run_manager.get_child())
        session = run_session(config)
        try:
            run = self._start(input)
            while not run.done:
                hop, model, prompt = run.model_call()
                step_config = hop_config(child_config, hop, session)
                chunks: list[BaseMessage] = []
                async for chunk in model.astream(prompt, step_config):
                    chunks.append(chunk)
                    yield AgentEvent("message_chunk", hop, chunk)
                reply = join_chunks(chunks)
                needs_tools = run.add_reply(reply)
                yield AgentEvent("message", hop, reply)
                if needs_tools:
                    output = await self.executor.ainvoke(run.tools_input(), step_config)
                    for message in run.add_tool_output(output):
                        yield AgentEvent("tool_result", hop, message)
            result = run.output()
        except BaseException as exc:
            await run_manager.on_chain_error(exc)
            raise
        finally:
            HUB.resume(session)
        await run_manager.on_chain_end(result)
        assert run.final is not None
        yield AgentEvent("final", run.hop, run.final, result)


def join_chunks(chunks: list[BaseMessage]) -> AIMessage:
    """One hop's streamed pieces as its complete ``AIMessage`` (tool calls parsed).

    A model that cannot stream yields its whole reply once, as an ``AIMessage``; no pieces at
    all read as an empty reply.

    Raises:
        InvalidRequestError: Pieces that are not AI message chunks.
    """
    if not chunks:
        return AIMessage("")
    if len(chunks) == 1 and isinstance(chunks[0], AIMessage) and not isinstance(
            chunks[0], AIMessageChunk):
        return chunks[0]
    if not all(isinstance(c, AIMessageChunk) for c in chunks):
        kinds = sorted({type(c).__name__ for c in chunks})
        raise InvalidRequestError(f"the agent's model streamed {kinds}, not AIMessageChunks")
    first, *rest = chunks
    merged = add_ai_message_chunks(first, *rest)  # type: ignore[arg-type]
    message = to_message(merged)
    assert isinstance(message, AIMessage)
    return message
