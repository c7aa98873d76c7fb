"""LangChain replies -> OpenAI ``chat.completion`` objects and ``chat.completion.chunk`` deltas.

:class:`ChunkWriter` keeps what the OpenAI stream contract needs across a reply's chunks:
the role goes in the first delta only; each tool call opens with its ``index``, ``id``, ``type``
and ``function.name`` (arguments ``""``), its arguments follow in later deltas of that
``index`` (one piece for a call that came whole, the model's argument text as it streams for
a streamed call, whose id and name come only with its opening); exactly one chunk carries ``finish_reason`` (``"tool_calls"`` when calls were
made); the usage chunk (``stream_options.include_usage``) has no choices.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from langchain_ascend.chat.call_streamer import cut_argument_text


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def openai_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """LangChain ``usage_metadata`` as OpenAI usage (``cache_read`` -> ``cached_tokens``)."""
    usage = usage or {}
    prompt = int(usage.get("input_tokens", 0))
    completion = int(usage.get("output_tokens", 0))
    cached = int((usage.get("input_token_details") or {}).get("cache_read", 0) or 0)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    reasoning = (usage.get("output_token_details") or {}).get("reasoning")
    if reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": int(reasoning)}
    return out


def openai_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"],
                         "arguments": json.dumps(call["args"], ensure_ascii=False)}}


def finish_reason_of(message: BaseMessage, has_calls: bool) -> str:
    """OpenAI's finish reason: ``stop``, ``length`` or ``tool_calls``."""
    reason = message.response_metadata.get("finish_reason") or "stop"
    if reason == "stop" and has_calls:
        return "tool_calls"
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def cut_by_length(message: BaseMessage) -> bool:
    return message.response_metadata.get("finish_reason") == "length"


def completion_object(message: AIMessage, *, model: str) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` of a reply. A call cut at ``max_tokens`` (the last
    invalid call of a reply that ended so) is a tool call whose arguments read as its stream
    sent them: the model's text then a closer, so they never parse and no client runs a call
    the budget cut short, with ``finish_reason="length"``. Another invalid call (one the
    model wrote but that does not parse) stays in the content as the model wrote it."""
    content = message.content if isinstance(message.content, str) else ""
    calls = [openai_tool_call(call) for call in message.tool_calls]
    invalid = list(message.invalid_tool_calls)
    last = invalid[-1] if invalid and cut_by_length(message) else None
    cut = cut_call(last) if last is not None else None
    if cut is not None:
        calls.append(cut)
        invalid.pop()
    content += "".join(str(call.get("args") or "") for call in invalid)
    reply: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else ""),
                             "refusal": None}
    if calls:
        reply["tool_calls"] = calls
    reasoning = message.additional_kwargs.get("reasoning_content")
    if reasoning:
        reply["reasoning_content"] = reasoning
    return {
        "id": completion_id(), "object": "chat.completion", "created": int(time.time()),
        "model": model, "system_fingerprint": None,
        "choices": [{"index": 0, "message": reply, "logprobs": None,
                     "finish_reason": finish_reason_of(message, bool(calls))}],
        "usage": openai_usage(message.usage_metadata),
    }


def cut_call(call: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tool call of an invalid ``call`` cut at ``max_tokens`` (its ``args``: the call's
    text, ``chat.messages``), as its stream reads; None where it is no single named call."""
    arguments = cut_argument_text(str(call.get("args") or ""))
    if arguments is None or not call.get("name") or not call.get("id"):
        return None
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": arguments}}


def valid_call_chunk(chunk: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tool-call chunk's arguments when it is a valid call (a name and a JSON object)."""
    if not chunk.get("name"):
        return None
    try:
        args = json.loads(chunk.get("args") or "")
    except json.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


class ChunkWriter:
    """Builds the ``chat.completion.chunk`` objects of one streamed reply."""

    def __init__(self, *, model: str, include_usage: bool) -> None:
        self.id = completion_id()
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.num_calls = 0
        self.role_sent = False
        self.streamed: dict[int, int] = {}  # streamed call's chunk index -> OpenAI index

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}],
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def role(self) -> dict[str, Any]:
        """The opening chunk: the role (and empty content), as OpenAI sends it."""
        self.role_sent = True
        return self.chunk({"role": "assistant", "content": ""})

    def deltas(self, message: BaseMessage) -> list[dict[str, Any]]:
        """The chunks of one ``AIMessageChunk`` (content, reasoning, tool calls)."""
        out = [] if self.role_sent else [self.role()]
        content = message.content if isinstance(message.content, str) else ""
        calls: list[dict[str, Any]] = []
        chunks = getattr(message, "tool_call_chunks", [])
        for i, call in enumerate(chunks):  # a reply cut at max_tokens ends with its cut call
            delta = self.call_delta(call, cut=cut_by_length(message) and i == len(chunks) - 1)
            if delta is None:  # what the model wrote, unparsed: text, as invalid calls are
                content += str(call.get("args") or "")
            else:
                calls.extend(delta)
        reasoning = message.additional_kwargs.get("reasoning_content")
        if reasoning:
            out.append(self.chunk({"reasoning_content": reasoning}))
        if content:
            out.append(self.chunk({"content": content}))
        out.extend(self.chunk({"tool_calls": [call]}) for call in calls)
        return out

    def call_delta(self, call: Mapping[str, Any], *, cut: bool = False
                   ) -> list[dict[str, Any]] | None:
        """The ``tool_calls`` delta entries of one tool-call chunk: a streamed call's opening
        (name, ``args=""``) or argument fragment, or a whole valid call (opening, then its
        arguments) - or, in a reply ``cut`` at ``max_tokens``, a whole call cut short
        (:func:`cut_call`); ``None`` for another whole invalid call."""
        index = call.get("index")
        if call.get("name") and call.get("args") == "" and isinstance(index, int):
            self.streamed[index] = self.num_calls
            return [self.opening(call)]
        if not call.get("name") and index in self.streamed:
            fragment = str(call.get("args") or "")
            return [{"index": self.streamed[index], "function": {"arguments": fragment}}
                    ] if fragment else []
        args = valid_call_chunk(call)
        whole = cut_call(call) if args is None and cut else None
        if args is None and whole is None:
            return None
        text = whole["function"]["arguments"] if whole else json.dumps(args, ensure_ascii=False)
        opening = self.opening(call)
        return [opening, {"index": opening["index"], "function": {"arguments": text}}]

    def opening(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """A call's first delta entry (index, id, name, empty arguments)."""
        index = self.num_calls
        self.num_calls += 1
        return {"index": index, "id": call.get("id"), "type": "function",
                "function": {"name": call["name"], "arguments": ""}}

    def finish(self, last: BaseMessage | None) -> list[dict[str, Any]]:
        """The closing chunks: the one ``finish_reason`` and, when asked, the usage."""
        out = [] if self.role_sent else [self.role()]
        reason = "stop" if last is None else finish_reason_of(last, self.num_calls > 0)
        out.append(self.chunk({}, finish_reason=reason))
        if self.include_usage:
            usage = getattr(last, "usage_metadata", None) if last is not None else None
            out.append({"id": self.id, "object": "chat.completion.chunk",
                        "created": self.created, "model": self.model,
                        "system_fingerprint": None, "choices": [],
                        "usage": openai_usage(usage)})
        return out
