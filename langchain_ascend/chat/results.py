"""Engine outputs -> LangChain results, with the note a forced output cut short needs.

A forced output (``tool_choice="required"``/a tool name, ``response_format``) follows its
grammar token by token, but ``max_tokens`` can end it before the grammar does, or shape its
end (the budget guard closes it early, taking tokens the model preferred away: the engine
finishes such a reply as cut by the length too, ``XGrammarConstraint.shortened``). Such a reply
keeps ``finish_reason="length"`` and gets ``response_metadata["output_error"]`` saying it was
cut at ``max_tokens=N``; for a forced tool call the error also stands in every
``invalid_tool_calls`` entry -- a call parsed from the cut reply moves there too, so no tool
runs with what the budget left of its arguments (:func:`forced_call_cut`), and one is added
when no call could be parsed at all -- so a caller never mistakes a cut call for a model that
chose not to call, nor for a call. A forced tool call that ends any other way without a valid
parsed call raises :class:`~langchain_ascend.errors.ForcedOutputError` (never
``finish_reason="stop"`` with empty ``tool_calls``).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from langchain_ascend.chat.prepare import PreparedRequest
from langchain_ascend.chat.reply import ReplyAssembler, delta_chunk, reply_message
from langchain_ascend.errors import ForcedOutputError


def cut_message(prepared: PreparedRequest) -> str:
    """The error text of a forced output cut at ``max_tokens``, or closed early by the budget
    guard to fit it (valid, but not what the model was writing)."""
    budget = prepared.params.max_tokens
    constraint = prepared.params.constraint
    if getattr(constraint, "shortened", False) and constraint.is_terminated():
        return (f"the forced {prepared.forced} was closed early to fit max_tokens={budget} "
                "(finish_reason='length'): its last values are what the budget left of the "
                "model's; raise max_tokens")
    return (f"the forced {prepared.forced} was cut at max_tokens={budget} before it was "
            "complete (finish_reason='length'); raise max_tokens")


def forced_call_cut(prepared: PreparedRequest, finish_reason: str | None) -> bool:
    """Whether a reply ending with ``finish_reason`` is a forced tool call cut at
    ``max_tokens``: no call, whatever parsed of it (module docstring)."""
    return prepared.forced_tool and finish_reason == "length"


def _was_cut(prepared: PreparedRequest, message: BaseMessage) -> bool:
    return (prepared.forced is not None
            and message.response_metadata.get("finish_reason") == "length")


def mark_cut(prepared: PreparedRequest, message: AIMessage,
             assembler: ReplyAssembler) -> AIMessage:
    """``message`` with the cut-short note when its forced output hit ``max_tokens``
    (``assembler``: the calls as the model wrote them)."""
    if not _was_cut(prepared, message):
        return message
    error = cut_message(prepared)
    message.response_metadata["output_error"] = error
    if prepared.forced_tool:
        # A call parsed from a cut reply is not one: its arguments may be what the budget let
        # the model write ("..." for a city), so it must not reach a tool.
        raw = {c.id: c.raw for c in assembler.calls}
        cut_calls = [invalid_tool_call(name=c["name"], id=c["id"], error=error,
                                       args=raw.get(c["id"] or "") or json.dumps(c["args"]))
                     for c in message.tool_calls]
        message.tool_calls = []
        if message.invalid_tool_calls or cut_calls:
            message.invalid_tool_calls = cut_calls + [{**c, "error": error}
                                                      for c in message.invalid_tool_calls]
        else:  # the text is the call's beginning: it moves into the invalid call
            text = message.content if isinstance(message.content, str) else ""
            message.content = ""
            message.invalid_tool_calls = [invalid_tool_call(name=None, args=text, id=None,
                                                            error=error)]
    return message


def check_forced_call(prepared: PreparedRequest, assembler: ReplyAssembler,
                      finish_reason: str | None, raw_text: str) -> None:
    """Raise when a forced tool call ended (not cut at ``max_tokens``) without a valid call.

    Raises:
        ForcedOutputError: The message names ``tool_choice`` and carries the raw reply.
    """
    if (not prepared.forced_tool or finish_reason == "length"
            or any(call.valid for call in assembler.calls)):
        return
    raise ForcedOutputError(
        f"the {prepared.forced} ended (finish_reason={finish_reason!r}) without a valid "
        f"tool call; raw reply: {raw_text[:500]!r}")


def chat_result(prepared: PreparedRequest, output: Any) -> ChatResult:
    """The ``ChatResult`` of a whole engine output.

    Raises:
        ForcedOutputError: See :func:`check_forced_call`.
    """
    assembler = prepared.new_assembler()
    message = reply_message(
        output, assembler, model_name=prepared.model_name, count_tokens=prepared.count_tokens,
    )
    check_forced_call(prepared, assembler, output.finish_reason, output.text)
    usage = message.usage_metadata or {}
    # what ChatOpenAI hands on_llm_end in llm_output (handlers read usage there)
    llm_output = {"model_name": prepared.model_name, "token_usage": {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0)}}
    return ChatResult(generations=[ChatGeneration(message=mark_cut(prepared, message, assembler))],
                      llm_output=llm_output)


def generation_chunk(prepared: PreparedRequest, assembler: Any, delta: Any
                     ) -> ChatGenerationChunk | None:
    """The chunk of one engine delta (None when it adds nothing); the last chunk of a cut
    forced output carries ``response_metadata["output_error"]``, the last chunk's
    ``usage_metadata`` is left out when the call asked ``stream_usage=False``.

    Raises:
        ForcedOutputError: At the last delta, see :func:`check_forced_call`.
    """
    chunk: AIMessageChunk | None = delta_chunk(
        delta, assembler, model_name=prepared.model_name, count_tokens=prepared.count_tokens
    )
    if chunk is None:
        return None
    if delta.finished:
        check_forced_call(prepared, assembler, delta.output.finish_reason, delta.output.text)
    if _was_cut(prepared, chunk):
        chunk.response_metadata["output_error"] = cut_message(prepared)
        if prepared.forced_tool:
            # a call that parsed from the cut reply is no call (mark_cut): a bracket closing
            # nothing ends its streamed arguments, so the merged chunks keep it invalid too
            spoilers = [tool_call_chunk(args="]", index=c.index) for c in assembler.calls
                        if c.valid]
            if spoilers:
                chunk = chunk + AIMessageChunk(content="", tool_call_chunks=spoilers)
    if not prepared.stream_usage:
        chunk.usage_metadata = None
    return ChatGenerationChunk(message=chunk)


def chunk_text(message: BaseMessage) -> str:
    """A chunk's text content ("" for block content)."""
    return message.content if isinstance(message.content, str) else ""
