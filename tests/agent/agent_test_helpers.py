"""A scripted chat model for the agent-loop tests: replies come from a function of the
conversation (or a list, in order), every call is recorded with the messages it saw and the
kwargs ``bind_tools`` bound, and ``stream`` yields the reply word by word then its tool calls.

Imported by file name (the tests folder is on ``sys.path``); the name is unique in the tree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import Field, PrivateAttr


def call(name: str, call_id: str, /, **args: Any) -> dict[str, Any]:
    """A ToolCall dict as a model produces it."""
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


class ScriptedToolModel(BaseChatModel):
    """Answers with ``responder(messages)`` (or the next of ``responses``); records calls."""

    responses: list[AIMessage] = Field(default_factory=list)
    responder: Any = None
    calls: list[dict[str, Any]] = Field(default_factory=list)
    """One entry per model call: ``{"messages": [...], "kwargs": {...}, "stream": bool}``."""
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Runnable[Any, Any]:  # type: ignore[override]
        return self.bind(bound_tools=[getattr(t, "name", t) for t in tools], **kwargs)

    def _reply(self, messages: list[BaseMessage], kwargs: dict[str, Any], stream: bool) -> AIMessage:
        with self._lock:
            self.calls.append({"messages": list(messages), "kwargs": dict(kwargs),
                               "stream": stream})
            if self.responder is not None:
                reply = self.responder(messages)
            else:
                if not self.responses:
                    raise AssertionError("the script ran out of replies")
                reply = self.responses.pop(0)
        return reply.model_copy(deep=True)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages, kwargs,
                                                                          False))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        reply = self._reply(messages, kwargs, True)
        words = str(reply.content).split(" ") if reply.content else []
        for i, word in enumerate(words):
            text = word if i == 0 else " " + word
            if run_manager:
                run_manager.on_llm_new_token(text)
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))
        tool_chunks = [{"name": c["name"], "args": _json(c["args"]), "id": c["id"],
                        "index": i, "type": "tool_call_chunk"}
                       for i, c in enumerate(reply.tool_calls)]
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", tool_call_chunks=tool_chunks, chunk_position="last"))  # type: ignore[arg-type]


def _json(args: dict[str, Any]) -> str:
    import json

    return json.dumps(args)


def scripted(*responses: AIMessage) -> ScriptedToolModel:
    """A model replying with ``responses`` in order."""
    return ScriptedToolModel(responses=list(responses))


def responding(responder: Callable[[list[BaseMessage]], AIMessage]) -> ScriptedToolModel:
    """A model replying with ``responder(messages)`` (called under a lock)."""
    return ScriptedToolModel(responder=responder)
