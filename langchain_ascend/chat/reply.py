"""Turn the engine's decoded reply into message parts, incrementally. Pure (no torch).

:class:`ReplyAssembler` is fed what the engine returns — streamed deltas, or the whole reply
at once — and hands back :class:`ReplyPiece` s: answer text, reasoning text and finished tool
calls. The pipeline is:

1. :class:`~langchain_ascend.chat.reasoning.ReasoningSplitter` routes ``<think>...</think>`` to
   reasoning;
2. :class:`~langchain_ascend.chat.tool_parsers.ToolCallStreamParser` splits the answer into content
   and tool calls (only when tools are bound).

Markers that are special tokens (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``...) are
already text: the engine keeps the ids :func:`reply_marker_ids` names.

The streamed and the one-shot path run the same code, so ``invoke`` and the aggregated
``stream`` agree. :func:`reply_message` and :func:`delta_chunk` turn the assembled parts and
the engine's output into the ``AIMessage`` / ``AIMessageChunk`` LangChain sees (usage,
finish reason, timings).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCallChunk

from langchain_ascend.chat.call_ids import new_tool_call_id
from langchain_ascend.chat.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningSplitter
from langchain_ascend.chat.tool_parsers import ExtractedCall, ToolCallStreamParser
from langchain_ascend.tool_formats import ToolCallFormat, markers_of


def reply_marker_ids(
    special_tokens: Mapping[str, int], *, tool_format: ToolCallFormat, parse_tools: bool,
    parse_reasoning: bool,
) -> frozenset[int]:
    """Ids of the special tokens the reply's text must keep for this assembler to read it:
    the tool-call markers of ``tool_format`` (when tools are parsed) and ``<think>`` /
    ``</think>`` (when reasoning is split off). The engine decodes them as text
    (``SamplingParams.keep_special_token_ids``), so sampled, drafted and grammar-forced
    markers reach the parser alike."""
    texts = set(markers_of(tool_format)) if parse_tools else set()
    if parse_reasoning:
        texts |= {THINK_OPEN, THINK_CLOSE}
    return frozenset(idx for text, idx in special_tokens.items() if text in texts)


@dataclass
class ReplyPiece:
    """New parts of the reply since the last piece: text, finished calls and the tool-call
    chunks to stream (fragments of a call under way, or whole calls)."""

    content: str = ""
    reasoning: str = ""
    calls: list[ExtractedCall] = field(default_factory=list)
    chunks: list[ToolCallChunk] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls or self.chunks)


class ReplyAssembler:
    """Incremental reply post-processing (markers -> reasoning -> tool calls).

    Args:
        parse_tools: Whether to look for tool calls (tools are bound and ``tool_choice`` is
            not ``"none"``).
        tool_format: Tool-call syntax(es) to recognise.
        tool_names: Names of the bound tools.
        parse_reasoning: Whether to split ``<think>`` sections off as reasoning.
        start_in_reasoning: The prompt already opened ``<think>``.
        id_factory: Makes the ids of parsed calls (default: random ``call_…`` ids; the chat
            model passes ``call_ids.reply_call_ids`` of the prompt, so ids repeat with it).
    """

    def __init__(
        self,
        *,
        parse_tools: bool = False,
        tool_format: ToolCallFormat = "auto",
        tool_names: Collection[str] | None = None,
        parse_reasoning: bool = True,
        start_in_reasoning: bool = False,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self._reasoning = ReasoningSplitter(
            start_in_reasoning=start_in_reasoning, enabled=parse_reasoning
        )
        self._tools = (
            ToolCallStreamParser(tool_format, tool_names=tool_names,
                                 id_factory=id_factory or new_tool_call_id)
            if parse_tools else None
        )
        self.content = ""
        self.reasoning = ""
        self.calls: list[ExtractedCall] = []

    def feed(self, text: str) -> ReplyPiece:
        """Consume one streamed delta or a whole reply."""
        split = self._reasoning.feed(text)
        return self._route(split.reasoning, split.content)

    def finish(self) -> ReplyPiece:
        """Flush everything held back at the end of the reply."""
        split = self._reasoning.finish()
        piece = self._route(split.reasoning, split.content)
        if self._tools is not None:
            tail = self._tools.finish()
            piece.content += tail.content
            piece.calls += tail.calls
            piece.chunks += tail.chunks
            self.content += tail.content
            self.calls += tail.calls
        return piece

    def _route(self, reasoning: str, content: str) -> ReplyPiece:
        piece = ReplyPiece(reasoning=reasoning)
        if self._tools is not None and content:
            parsed = self._tools.feed(content)
            piece.content, piece.calls, piece.chunks = parsed.content, parsed.calls, parsed.chunks
        else:
            piece.content = content
        self.reasoning += piece.reasoning
        self.content += piece.content
        self.calls += piece.calls
        return piece


def usage_and_metadata(
    output: Any, assembler: ReplyAssembler, *, model_name: str,
    count_tokens: Callable[[str], int],
) -> tuple[UsageMetadata, dict[str, Any]]:
    """``usage_metadata`` and ``response_metadata`` of a finished reply.

    Args:
        output: The engine's ``RequestOutput`` (its ``stats``, ``finish_reason``,
            ``stop_reason``).
        assembler: The finished assembler of that reply.
        model_name: The model the reply came from.
        count_tokens: Tokens of a text (for the reasoning token count).
    """
    stats = output.stats
    input_tokens = int(stats.num_prompt_tokens)
    output_tokens = int(stats.num_generated_tokens)
    usage = UsageMetadata(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_token_details={"cache_read": int(stats.num_cached_tokens)},
    )
    if assembler.reasoning:
        reasoning_tokens = count_tokens(assembler.reasoning)
        usage["output_token_details"] = {"reasoning": min(reasoning_tokens, output_tokens)}
    finish_reason = output.finish_reason
    if finish_reason == "stop" and any(c.valid for c in assembler.calls):
        finish_reason = "tool_calls"
    metadata = {
        "model_name": model_name,
        "model_provider": "ascend",
        "finish_reason": finish_reason,
        "stop_reason": output.stop_reason,
        "timings": {
            "queue": stats.queue_time,
            "time_to_first_token": stats.time_to_first_token,
            "decode": stats.decode_time,
        },
        # Tokens per forward pass = output tokens / forward_passes.
        "speculative": {
            "draft_tokens": int(stats.num_draft_tokens),
            "accepted_tokens": int(stats.num_accepted_tokens),
            "forced_tokens": int(stats.num_forced_tokens),
            "forward_passes": int(stats.num_forward_passes),
        },
    }
    return usage, metadata


def reply_message(
    output: Any, assembler: ReplyAssembler, *, model_name: str,
    count_tokens: Callable[[str], int],
) -> AIMessage:
    """Feed a whole engine output through ``assembler`` and build the ``AIMessage``."""
    assembler.feed(output.text)
    assembler.finish()
    usage, metadata = usage_and_metadata(
        output, assembler, model_name=model_name, count_tokens=count_tokens
    )
    additional: dict[str, Any] = {}
    if assembler.reasoning:
        additional["reasoning_content"] = assembler.reasoning
    return AIMessage(
        content=assembler.content,
        additional_kwargs=additional,
        tool_calls=[c.to_tool_call() for c in assembler.calls if c.valid],
        invalid_tool_calls=[c.to_invalid_tool_call() for c in assembler.calls if not c.valid],
        usage_metadata=usage,
        response_metadata=metadata,
    )


def coalesced(chunks: list[ToolCallChunk]) -> list[ToolCallChunk]:
    """One tool-call chunk per index: fragments of a call that came in the same delta are
    joined (LangChain merges chunks by index across messages, not within one)."""
    out: list[ToolCallChunk] = []
    for chunk in chunks:
        if out and out[-1]["index"] == chunk["index"] and chunk["name"] is None:
            out[-1] = {**out[-1], "args": (out[-1]["args"] or "") + (chunk["args"] or "")}
        else:
            out.append(chunk)
    return out


def piece_chunk(piece: ReplyPiece, **extra: Any) -> AIMessageChunk:
    """One streamed piece as an ``AIMessageChunk`` (``extra``: further chunk fields)."""
    additional = {"reasoning_content": piece.reasoning} if piece.reasoning else {}
    return AIMessageChunk(
        content=piece.content,
        additional_kwargs=additional,
        tool_call_chunks=coalesced(piece.chunks),
        **extra,
    )


def delta_chunk(
    delta: Any, assembler: ReplyAssembler, *, model_name: str,
    count_tokens: Callable[[str], int],
) -> AIMessageChunk | None:
    """The chunk for one engine ``TokenDelta``; ``None`` when it adds nothing yet.

    The last delta flushes the assembler and carries usage, metadata and
    ``chunk_position="last"``.
    """
    piece = assembler.feed(delta.text)
    if delta.finished:
        tail = assembler.finish()
        piece = ReplyPiece(
            content=piece.content + tail.content,
            reasoning=piece.reasoning + tail.reasoning,
            calls=piece.calls + tail.calls,
            chunks=piece.chunks + tail.chunks,
        )
        usage, metadata = usage_and_metadata(
            delta.output, assembler, model_name=model_name, count_tokens=count_tokens
        )
        return piece_chunk(
            piece, usage_metadata=usage, response_metadata=metadata, chunk_position="last"
        )
    if not piece:
        return None
    return piece_chunk(piece)
