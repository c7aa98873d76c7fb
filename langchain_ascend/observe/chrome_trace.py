"""The timeline as a Chrome trace (Trace Event Format), for ``chrome://tracing`` and Perfetto.

Layout: one process (``pid``) per run (:meth:`Snapshot.runs`), one thread (``tid``) per track:
``model`` (the hops), ``retrieval``, then ``tool``, ``tool 2``... so parallel tool calls sit on
their own rows. Events are complete events (``ph: "X"``, ``ts``/``dur`` in microseconds since
the timeline's first event) plus ``ph: "M"`` metadata naming processes and threads:

* ``cat: "hop"`` — one per chat-model call; ``args``: tokens in / cached / new / out, tokens per
  pass, engine queue / time-to-first-token / decode seconds, finish reason, tool calls asked;
* ``cat: "phase"`` — the hop's ``other`` / ``queue`` / ``prefill`` / ``decode`` slices, nested
  inside it on the same row;
* ``cat: "tool"`` — one per tool call; ``args``: status, attempts, retries, call id, error;
* ``cat: "retrieval"`` — one per retriever call; ``args``: query, documents, error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_ascend.observe.records import (
    HopSpan,
    RetrievalSpan,
    RunLayout,
    Snapshot,
    ToolSpan,
)

_TRACK_ORDER = {"model": 0, "retrieval": 1, "tool": 2}


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def _end(span: HopSpan | ToolSpan | RetrievalSpan) -> float:
    return span.end if span.end is not None else span.start


def trace_events(snapshot: Snapshot) -> list[dict[str, Any]]:
    """All events of ``snapshot`` (see the module docstring)."""
    events: list[dict[str, Any]] = []
    for pid, run in enumerate(snapshot.runs(), 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": run.name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for tid, track in enumerate(run.tracks, 1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": track.label}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": _TRACK_ORDER[track.kind] * 1000 + track.index}})
            for span in track.spans:
                events.extend(_span_events(span, run, pid, tid))
    return events


def _span_events(span: HopSpan | ToolSpan | RetrievalSpan, run: RunLayout, pid: int,
                 tid: int) -> list[dict[str, Any]]:
    ts, end = _us(span.start), _us(_end(span))
    base = {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": max(end - ts, 0)}
    if isinstance(span, HopSpan):
        number = run.hop_number(span)
        hop = {**base, "cat": "hop", "name": f"hop {number}: {span.model}",
               "args": _hop_args(span, number)}
        phases = []
        for seg in span.segments():
            seg_ts = min(max(_us(seg.start), ts), end)
            seg_end = min(max(_us(seg.end), seg_ts), end)
            phases.append({"ph": "X", "pid": pid, "tid": tid, "cat": "phase", "name": seg.kind,
                           "ts": seg_ts, "dur": seg_end - seg_ts,
                           "args": {"hop": number, **_phase_args(span, seg.kind)}})
        fed = [{"ph": "X", "pid": pid, "tid": tid, "cat": "phase", "name": "tool-time prefill",
                "ts": _us(start), "dur": max(_us(stop) - _us(start), 0),
                "args": {"feeds_hop": number, "tokens": tokens}}
               for start, stop, tokens in span.tool_time_prefills]
        return [hop, *phases, *fed]
    if isinstance(span, ToolSpan):
        return [{**base, "cat": "tool", "name": span.name, "args": {
            "status": span.status, "attempts": span.attempts, "retries": span.retries,
            "tool_call_id": span.tool_call_id, "error": span.error,
            "duration_s": round(span.duration, 6)}}]
    return [{**base, "cat": "retrieval", "name": span.name, "args": {
        "query": span.query, "documents": span.num_documents, "error": span.error,
        "duration_s": round(span.duration, 6)}}]


def _hop_args(hop: HopSpan, number: int) -> dict[str, Any]:
    args: dict[str, Any] = {
        "hop": number, "model": hop.model, "input_tokens": hop.input_tokens,
        "cached_tokens": hop.cached_tokens, "new_tokens": hop.new_tokens,
        "output_tokens": hop.output_tokens, "tokens_per_pass": round(hop.tokens_per_pass, 3),
        "queue_s": hop.queue_s, "time_to_first_token_s": hop.ttft_s, "decode_s": hop.decode_s,
        "duration_s": round(hop.duration, 6), "finish_reason": hop.finish_reason,
        "tool_calls": hop.num_tool_calls,
    }
    if hop.speculative is not None:
        args["speculative"] = hop.speculative
    if hop.error is not None:
        args["error"] = hop.error
    return args


def _phase_args(hop: HopSpan, kind: str) -> dict[str, Any]:
    if kind == "prefill":
        return {"new_tokens": hop.new_tokens, "cached_tokens": hop.cached_tokens}
    if kind == "decode":
        return {"output_tokens": hop.output_tokens,
                "tokens_per_pass": round(hop.tokens_per_pass, 3)}
    return {}


def trace_dict(snapshot: Snapshot) -> dict[str, Any]:
    """The JSON object written to the trace file."""
    return {"traceEvents": trace_events(snapshot), "displayTimeUnit": "ms",
            "otherData": {"producer": "langchain_ascend.observe.AscendTimeline"}}


def write_trace(snapshot: Snapshot, path: Path) -> Path:
    """Write :func:`trace_dict` of ``snapshot`` to ``path`` (parent folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_dict(snapshot), indent=1, default=str))
    return path
