"""Turn the engine's decoded reply into message parts, incrementally. Pure (no torch).

:class:`ReplyAssembler` is fed what the engine returns — streamed deltas, or the whole reply
at once — and hands back :class:`ReplyPiece` s: answer text, reasoning text and finished tool
calls. The pipeline is:

1. special marker tokens the decoder dropped (``skip_special_tokens``), such as Mistral's
   ``[TOOL_CALLS]`` or Llama's ``<|python_tag|>``, are put back from the token ids;
2. :class:`~langchain_ascend.chat.reasoning.ReasoningSplitter` routes ``<think>...</think>`` to
   reasoning;
3. :class:`~langchain_ascend.chat.tool_parsers.ToolCallStreamParser` splits the answer into content
   and tool calls (only when tools are bound).

The streamed and the one-shot path run the same code, so ``invoke`` and the aggregated
``stream`` agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from langchain_ascend.chat.reasoning import ReasoningSplitter
from langchain_ascend.chat.tool_parsers import (
    MISTRAL_ARGS,
    MISTRAL_CALL_ID,
    MISTRAL_MARKER,
    PYTHON_TAG,
    ExtractedCall,
    ToolCallFormat,
    ToolCallStreamParser,
)

# Marker texts worth restoring when the tokenizer makes them special tokens.
TOOL_MARKERS: tuple[str, ...] = (MISTRAL_MARKER, MISTRAL_ARGS, MISTRAL_CALL_ID, PYTHON_TAG)


def special_marker_ids(special_tokens: Mapping[str, int]) -> dict[int, str]:
    """Map the ids of special tokens that are tool-call markers to their text."""
    return {idx: text for text, idx in special_tokens.items() if text in TOOL_MARKERS}


@dataclass
class ReplyPiece:
    """New parts of the reply since the last piece."""

    content: str = ""
    reasoning: str = ""
    calls: list[ExtractedCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)


class ReplyAssembler:
    """Incremental reply post-processing (markers -> reasoning -> tool calls).

    Args:
        parse_tools: Whether to look for tool calls (tools are bound and ``tool_choice`` is
            not ``"none"``).
        tool_format: Tool-call syntax(es) to recognise.
        tool_names: Names of the bound tools.
        parse_reasoning: Whether to split ``<think>`` sections off as reasoning.
        start_in_reasoning: The prompt already opened ``<think>``.
        marker_ids: Special-token ids of tool-call markers to restore (see
            :func:`special_marker_ids`).
    """

    def __init__(
        self,
        *,
        parse_tools: bool = False,
        tool_format: ToolCallFormat = "auto",
        tool_names: Collection[str] | None = None,
        parse_reasoning: bool = True,
        start_in_reasoning: bool = False,
        marker_ids: Mapping[int, str] | None = None,
    ) -> None:
        self._reasoning = ReasoningSplitter(
            start_in_reasoning=start_in_reasoning, enabled=parse_reasoning
        )
        self._tools = (
            ToolCallStreamParser(tool_format, tool_names=tool_names) if parse_tools else None
        )
        self._marker_ids = dict(marker_ids or {})
        self.content = ""
        self.reasoning = ""
        self.calls: list[ExtractedCall] = []

    def restore_markers(self, text: str, token_ids: Sequence[int]) -> str:
        """Put back marker tokens the decoder skipped (they come before the delta's text)."""
        if not self._marker_ids:
            return text
        markers = "".join(self._marker_ids[t] for t in token_ids if t in self._marker_ids)
        return markers + text if markers and not text.startswith(markers) else text

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> ReplyPiece:
        """Consume one streamed delta (its text and token ids)."""
        text = self.restore_markers(text, token_ids)
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
            self.content += tail.content
            self.calls += tail.calls
        return piece

    def _route(self, reasoning: str, content: str) -> ReplyPiece:
        piece = ReplyPiece(reasoning=reasoning)
        if self._tools is not None and content:
            parsed = self._tools.feed(content)
            piece.content, piece.calls = parsed.content, parsed.calls
        else:
            piece.content = content
        self.reasoning += piece.reasoning
        self.content += piece.content
        self.calls += piece.calls
        return piece


def text_with_markers(
    tokenizer: object, token_ids: Sequence[int], text: str, marker_ids: Mapping[int, str]
) -> str:
    """The reply text with skipped marker tokens put back, for a one-shot result.

    Returns ``text`` unchanged unless a marker token occurs; then the reply is re-decoded in
    segments around the markers.
    """
    if not marker_ids or not any(t in marker_ids for t in token_ids):
        return text
    parts: list[str] = []
    segment: list[int] = []
    decode = tokenizer.decode  # type: ignore[attr-defined]
    for token in token_ids:
        if token in marker_ids:
            parts.append(decode(segment, skip_special_tokens=True))
            parts.append(marker_ids[token])
            segment = []
        else:
            segment.append(token)
    parts.append(decode(segment, skip_special_tokens=True))
    return "".join(parts)
