"""One agent run's state, free of I/O: what the next model call gets, what a reply and the
tools' output add, when the run stops. The four drivers in :mod:`.loop` (invoke, ainvoke,
stream, astream) differ only in how they call the model and the executor."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig

from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError
from langchain_ascend.executor.session_hub import SESSION_KEY, session_of

#: ``response_metadata["finish_reason"]`` of the message that ends a run at ``max_hops``.
HOP_LIMIT_REASON = "max_hops"

#: Metadata key set on every hop's RunnableConfig: callback handlers see which hop a model or
#: tool run belongs to (``kwargs["metadata"]["agent_hop"]``).
HOP_METADATA_KEY = "agent_hop"


def parse_input(value: Any) -> tuple[list[BaseMessage], dict[str, Any]]:
    """The conversation an agent run starts from, and the other keys of a state dict.

    Accepts a string (one human turn), a message, a ``PromptValue``, a list of messages (or
    message-likes: ``("human", "hi")``, dicts) or ``{"messages": [...], ...}``.

    Raises:
        InvalidArgumentTypeError: Any other type, or a dict without ``"messages"``.
        InvalidRequestError: An empty conversation.
    """
    extra: dict[str, Any] = {}
    raw: Any = value
    if isinstance(value, Mapping):
        if "messages" not in value:
            raise InvalidArgumentTypeError(
                f"an agent state dict needs a 'messages' key; got keys {sorted(value)!r}")
        extra = {k: v for k, v in value.items() if k != "messages"}
        raw = value["messages"]
    if isinstance(raw, str):
        messages: list[BaseMessage] = [HumanMessage(raw)]
    elif isinstance(raw, BaseMessage):
        messages = [raw]
    elif isinstance(raw, PromptValue):
        messages = raw.to_messages()
    elif isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        try:
            messages = convert_to_messages(list(raw))
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise InvalidArgumentTypeError(f"cannot read the agent's messages: {exc}") from exc
    else:
        raise InvalidArgumentTypeError(
            "an agent takes a string, a list of messages or {'messages': [...]}; got "
            f"{type(raw).__name__} {raw!r:.60}")
    if not messages:
        raise InvalidRequestError("an agent run needs at least one message; got none")
    return messages, extra


def run_session(config: RunnableConfig | None) -> str:
    """The agent session of one run: the one its config names (``executor.session_hub``), else
    a fresh id. The model (``AscendChatModel``) and the executor read it from each hop's
    metadata, so the engine keeps the run's KV blocks while its tools run."""
    return session_of(config) or f"agent-{uuid.uuid4().hex}"


def hop_config(config: RunnableConfig, hop: int, session_id: str | None = None
               ) -> RunnableConfig:
    """``config`` with the hop number (and the run's session) in its metadata (inherited by
    every child run)."""
    metadata = {**(config.get("metadata") or {}), HOP_METADATA_KEY: hop}
    if session_id is not None:
        metadata[SESSION_KEY] = session_id
    return {**config, "metadata": metadata}  # type: ignore[typeddict-item]


def tool_messages(output: Any) -> list[ToolMessage]:
    """The ``ToolMessage``\\ s in an executor's output: a list of them, ``{"messages": [...]}``,
    or langgraph ``Command``\\ s whose update carries messages (their other updates are
    dropped: outside a graph there is no state to update).

    Raises:
        InvalidRequestError: Output holding anything else.
    """
    items = output.get("messages", []) if isinstance(output, Mapping) else output
    if not isinstance(items, list):
        items = [items]
    found: list[ToolMessage] = []
    for item in items:
        if isinstance(item, ToolMessage):
            found.append(item)
            continue
        update = getattr(item, "update", None)
        inner = update.get("messages") if isinstance(update, Mapping) else update
        if isinstance(inner, list) and all(isinstance(m, BaseMessage) for m in inner):
            found.extend(m for m in inner if isinstance(m, ToolMessage))
            continue
        raise InvalidRequestError(
            f"the tool executor returned {type(item).__name__} {item!r:.80}; the agent expects "
            "ToolMessages (or Commands carrying them)")
    return found


def hop_limit_message(max_hops: int, num_pending: int) -> AIMessage:
    """The run's last message when the model still asked for tools at its last allowed hop."""
    return AIMessage(
        f"Stopped: the agent reached its limit of {max_hops} model call(s) (max_hops) before "
        f"the model gave a final answer; the results of its last {num_pending} tool call(s) "
        "are above.",
        response_metadata={"finish_reason": HOP_LIMIT_REASON, "max_hops": max_hops},
    )


class AgentRun:
    """The state of one run: the conversation so far and which hop comes next.

    Protocol, for each hop: :meth:`model_call` -> call the model -> :meth:`add_reply`; if that
    returns True, call the executor on :meth:`tools_input` -> :meth:`add_tool_output`. Stop
    when :attr:`done`; then :meth:`output` is the result.

    Invariant: every ``AIMessage`` with tool calls in :attr:`messages` is followed by the
    executor's ``ToolMessage``\\ s for it, so the transcript can be sent to a model again.
    """

    def __init__(self, value: Any, *, models: Sequence[Runnable[Any, Any]],
                 system_prompt: str | None, messages_key: str) -> None:
        """
        Args:
            value: The run's input (see :func:`parse_input`).
            models: The bound model of each hop, ``models[hop - 1]``; its length is max_hops.
            system_prompt: Sent first on every model call; never stored in the messages.
            messages_key: The state key the executor reads its messages from.
        """
        self.messages, self.extra = parse_input(value)
        self._models = models
        self._system = [SystemMessage(system_prompt)] if system_prompt else []
        self._messages_key = messages_key
        self.hop = 0
        self.done = False
        self.final: AIMessage | None = None
        self._reply: AIMessage | None = None

    @property
    def max_hops(self) -> int:
        return len(self._models)

    def model_call(self) -> tuple[int, Runnable[Any, Any], list[BaseMessage]]:
        """The next hop's number, its bound model, and the messages to send it."""
        assert not self.done
        self.hop += 1
        return self.hop, self._models[self.hop - 1], self._system + self.messages

    def add_reply(self, reply: BaseMessage) -> bool:
        """Record the model's reply; True when its tool calls must be run now.

        Raises:
            InvalidRequestError: The model returned something other than an AI message.
        """
        if not isinstance(reply, AIMessage):
            raise InvalidRequestError(
                f"the agent's model returned {type(reply).__name__}, not an AIMessage")
        self.messages.append(reply)
        self._reply = reply
        if not reply.tool_calls or reply.response_metadata.get("output_error"):
            # no calls, or calls of a forced output cut at max_tokens (a streamed reply keeps
            # the chunks' calls; its last chunk says it was cut): nothing to run
            self.done = True
            self.final = reply
            return False
        return True

    def tools_input(self) -> dict[str, Any]:
        """The executor's input: the state, whose last message holds the calls to run (tools
        with ``InjectedState`` read the conversation and the state's other keys from it)."""
        return {**self.extra, self._messages_key: list(self.messages)}

    def add_tool_output(self, output: Any) -> list[ToolMessage]:
        """Record the executor's output; returns its ``ToolMessage``\\ s, in call order."""
        results = tool_messages(output)
        self.messages.extend(results)
        if self.hop >= self.max_hops:
            assert self._reply is not None
            self.final = hop_limit_message(self.max_hops, len(self._reply.tool_calls))
            self.messages.append(self.final)
            self.done = True
        return results

    def output(self) -> dict[str, Any]:
        """``{"messages": [...]}`` (plus the input state's other keys): the input messages,
        every hop's reply and tool results, and the final ``AIMessage`` last."""
        assert self.done
        return {**self.extra, "messages": list(self.messages)}
