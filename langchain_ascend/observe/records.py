"""What :class:`~langchain_ascend.observe.AscendTimeline` records, and how the writers lay it out.

Pure data: no LangChain, no torch, no matplotlib. Times are seconds since the timeline's
origin (its first event), from ``time.perf_counter``.

Layout shared by the trace, the chart and the summary:

* a **run** is one top-level LangChain chain run (one agent invocation, one element of a
  ``batch``); calls made outside any chain (a hand-written loop calling ``llm.invoke`` and the
  executor) share one run named ``"calls"``, as does a tool executor invoked on its own;
* inside a run, hops, tool calls and retrievals each get **tracks**: spans that overlap in time
  go on different tracks of their kind (so parallel tool calls sit side by side), spans that do
  not share the first free track.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

ToolStatus = Literal["running", "ok", "error", "timeout"]
SegmentKind = Literal["other", "queue", "prefill", "decode"]

#: Name of the run that holds the calls made outside any chain run.
LOOSE_RUN = "calls"


@dataclass
class Segment:
    """One phase of a hop: ``"other"`` (template, tokenize, reply assembly: the hop's time
    outside the engine), ``"queue"`` (waiting to be scheduled), ``"prefill"`` (the prompt's
    uncached tokens, up to the first token) or ``"decode"`` (the rest of the tokens)."""

    kind: SegmentKind
    start: float
    end: float


@dataclass
class HopSpan:
    """One chat-model call.

    Attributes:
        run_id: The LangChain run id of the call.
        root_id: The top-level run it belongs to (itself when it has no parent).
        model: The model's name.
        start: ``on_chat_model_start`` time.
        end: ``on_llm_end`` / ``on_llm_error`` time (None while running).
        input_tokens: Prompt tokens (``usage_metadata``).
        cached_tokens: Prompt tokens served from the prefix cache
            (``input_token_details["cache_read"]``).
        output_tokens: Generated tokens.
        queue_s: Engine queue wait (``response_metadata["timings"]["queue"]``); None when the
            model reports no timings.
        ttft_s: Engine arrival to first token.
        decode_s: First token to the last.
        tokens_per_pass: Output tokens per forward pass (speculative decoding and forced
            tokens make it > 1); 1.0 without ``response_metadata["speculative"]``.
        speculative: The ``speculative`` dict as the model reported it, if any.
        first_token: Time of the first streamed token (``on_llm_new_token``), if streamed.
        finish_reason: From ``response_metadata``.
        num_tool_calls: Tool calls in the reply.
        error: The error text when the call failed.
        tool_time_prefills: Background prefills of the tool results that fed this hop,
            ``(start, end, tokens)`` on the timeline's clock (``AscendChatModel`` with a
            session: ``response_metadata["tool_time_prefills"]``).
    """

    run_id: str
    root_id: str
    model: str
    start: float
    end: float | None = None
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    queue_s: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    tokens_per_pass: float = 1.0
    speculative: dict[str, int] | None = None
    first_token: float | None = None
    finish_reason: str | None = None
    num_tool_calls: int = 0
    error: str | None = None
    tool_time_prefills: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        """Prompt tokens that were computed (not served from the cache)."""
        return max(self.input_tokens - self.cached_tokens, 0)

    @property
    def duration(self) -> float:
        return max((self.end if self.end is not None else self.start) - self.start, 0.0)

    def segments(self) -> list[Segment]:
        """The hop's phases, inside ``[start, end]``.

        With engine timings the phases are placed backwards from the end: decode ends at
        ``end``, the first token is ``decode_s`` before it, the request arrived ``ttft_s``
        before that and queued for ``queue_s``; the time before arrival (and any the engine
        does not account for) is ``"other"``. With only a streamed first token: prefill up
        to it, decode after. Without either: one ``"other"`` segment.
        """
        end = self.end if self.end is not None else self.start
        if self.decode_s is not None and self.ttft_s is not None:
            decode_start = max(self.start, end - max(self.decode_s, 0.0))
            arrival = max(self.start, decode_start - max(self.ttft_s, 0.0))
            queue_end = min(decode_start, arrival + max(self.queue_s or 0.0, 0.0))
            parts = [Segment("other", self.start, arrival), Segment("queue", arrival, queue_end),
                     Segment("prefill", queue_end, decode_start),
                     Segment("decode", decode_start, end)]
            return [p for p in parts if p.end > p.start]
        if self.first_token is not None and self.start <= self.first_token <= end:
            parts = [Segment("prefill", self.start, self.first_token),
                     Segment("decode", self.first_token, end)]
            return [p for p in parts if p.end > p.start]
        return [Segment("other", self.start, end)] if end > self.start else []


@dataclass
class ToolSpan:
    """One tool call, across its attempts (retries run the tool again under the same
    ``tool_call_id``).

    Attributes:
        key: ``parent run id / tool_call_id`` (the run id when the call has no id).
        root_id: The top-level run it belongs to.
        parent_id: The run that ran the tool (the executor's chain run, a graph node).
        name: The tool's name.
        tool_call_id: The model's call id, if any.
        start: First attempt's start.
        end: Last attempt's end (None while running).
        status: ``"ok"``, ``"error"``, ``"timeout"`` (the executor's deadline passed) or
            ``"running"``.
        attempts: Attempts seen (tool runs started), or the executor's count when larger.
        retries: ``attempts - 1``, or the executor's ``tool_timing["retries"]``.
        error: The last error's text.
    """

    key: str
    root_id: str
    parent_id: str | None
    name: str
    tool_call_id: str | None
    start: float
    end: float | None = None
    status: ToolStatus = "running"
    attempts: int = 0
    retries: int = 0
    error: str | None = None
    open_attempts: set[str] = field(default_factory=set)

    @property
    def duration(self) -> float:
        return max((self.end if self.end is not None else self.start) - self.start, 0.0)


@dataclass
class RetrievalSpan:
    """One retriever call (embedding the query and searching the store: LangChain has no
    callbacks for embeddings, so a retrieval span is where the embedding time shows).

    Attributes:
        run_id: The retriever run id.
        root_id: The top-level run it belongs to.
        name: The retriever's name.
        query: The query text.
        start: ``on_retriever_start`` time.
        end: ``on_retriever_end`` / ``on_retriever_error`` time.
        num_documents: Documents returned.
        error: The error text when it failed.
    """

    run_id: str
    root_id: str
    name: str
    query: str
    start: float
    end: float | None = None
    num_documents: int = 0
    error: str | None = None

    @property
    def duration(self) -> float:
        return max((self.end if self.end is not None else self.start) - self.start, 0.0)


Span = HopSpan | ToolSpan | RetrievalSpan


@dataclass
class Track:
    """One row of the chart / one thread of the trace."""

    kind: Literal["model", "tool", "retrieval"]
    index: int
    spans: list[Span] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.kind if self.index == 0 else f"{self.kind} {self.index + 1}"


@dataclass
class RunLayout:
    """One run (agent invocation) and its tracks, hops numbered in start order."""

    name: str
    tracks: list[Track]
    hops: list[HopSpan]
    tools: list[ToolSpan]
    retrievals: list[RetrievalSpan]

    def hop_number(self, hop: HopSpan) -> int:
        """1-based position of ``hop`` among the run's hops."""
        return next(i for i, h in enumerate(self.hops, 1) if h is hop)


@dataclass
class Snapshot:
    """A consistent copy of everything recorded, as the writers read it."""

    hops: list[HopSpan]
    tools: list[ToolSpan]
    retrievals: list[RetrievalSpan]
    root_names: dict[str, str]
    chain_roots: set[str]

    @property
    def end(self) -> float:
        """Latest end (or start) of any span."""
        spans: list[Span] = [*self.hops, *self.tools, *self.retrievals]
        return max((s.end if s.end is not None else s.start for s in spans), default=0.0)

    def runs(self) -> list[RunLayout]:
        """The runs in order of their first span, each with its tracks (module docstring)."""
        groups: dict[str, list[Span]] = {}
        spans: list[Span] = sorted([*self.hops, *self.tools, *self.retrievals],
                                   key=lambda s: s.start)
        rich_roots = {s.root_id for s in spans if not isinstance(s, ToolSpan)}
        for span in spans:
            groups.setdefault(self._group_of(span, rich_roots), []).append(span)
        layouts: list[RunLayout] = []
        counts: dict[str, int] = {}
        for group, members in groups.items():
            base = LOOSE_RUN if group == LOOSE_RUN else self.root_names.get(group, "run")
            counts[base] = counts.get(base, 0) + 1
            name = base if counts[base] == 1 else f"{base} #{counts[base]}"
            tracks = [t for kind in ("model", "retrieval", "tool")
                      for t in pack_tracks(kind, [s for s in members if _kind(s) == kind])]
            layouts.append(RunLayout(
                name=name, tracks=tracks,
                hops=[s for s in members if isinstance(s, HopSpan)],
                tools=[s for s in members if isinstance(s, ToolSpan)],
                retrievals=[s for s in members if isinstance(s, RetrievalSpan)]))
        _number_duplicates(layouts)
        return layouts

    def _group_of(self, span: Span, rich_roots: set[str]) -> str:
        root = span.root_id
        if root not in self.chain_roots:
            return LOOSE_RUN
        # A chain root holding only tool calls is an executor invoked on its own.
        if root not in rich_roots:
            return LOOSE_RUN
        return root


def _number_duplicates(layouts: list[RunLayout]) -> None:
    """Name the first of several same-named runs ``name #1`` too."""
    names = [layout.name for layout in layouts]
    for layout in layouts:
        if f"{layout.name} #2" in names:
            layout.name = f"{layout.name} #1"


def _kind(span: Span) -> str:
    if isinstance(span, HopSpan):
        return "model"
    if isinstance(span, ToolSpan):
        return "tool"
    return "retrieval"


def pack_tracks(kind: str, spans: Iterable[Span]) -> list[Track]:
    """Spans of one kind on as few tracks as possible, none overlapping on a track.

    Greedy by start time: each span goes on the first track whose last span ended by its start.
    """
    tracks: list[Track] = []
    track_end: list[float] = []
    for span in sorted(spans, key=lambda s: s.start):
        end = span.end if span.end is not None else span.start
        for i, last in enumerate(track_end):
            if last <= span.start:
                tracks[i].spans.append(span)
                track_end[i] = end
                break
        else:
            tracks.append(Track(kind, len(tracks), [span]))  # type: ignore[arg-type]
            track_end.append(end)
    return tracks
