"""The timeline as a plain-text table: per run, one row per hop, tool call and retrieval.

Hop rows: start and total seconds, the engine's queue / prefill / decode seconds (``-`` when
the model reports none), prompt tokens in / cached / new, tokens out and tokens per forward
pass. Tool rows: start, duration, status and retries. Totals close the table: model time, tool
time, the share of prompt tokens served from the prefix cache.
"""

from __future__ import annotations

from langchain_ascend.observe.records import HopSpan, RunLayout, Snapshot, ToolSpan

_HOP_HEAD = (f"  {'hop':<28} {'start':>7} {'total':>7} {'queue':>7} {'prefill':>7} "
             f"{'decode':>7} {'in':>6} {'cached':>6} {'new':>6} {'out':>5} {'tok/pass':>8}")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _phase_seconds(hop: HopSpan) -> tuple[float | None, float | None, float | None]:
    """Queue, prefill and decode seconds of ``hop`` (None when unknown)."""
    by_kind: dict[str, float] = {}
    for seg in hop.segments():
        by_kind[seg.kind] = by_kind.get(seg.kind, 0.0) + seg.end - seg.start
    if hop.decode_s is None and hop.first_token is None:
        return None, None, None
    queue = by_kind.get("queue", 0.0) if hop.queue_s is not None else None
    return queue, by_kind.get("prefill", 0.0), by_kind.get("decode", 0.0)


def _hop_row(run: RunLayout, hop: HopSpan) -> str:
    queue, prefill, decode = _phase_seconds(hop)
    label = f"{run.hop_number(hop)} {hop.model}"[:28]
    row = (f"  {label:<28} {_s(hop.start):>7} {_s(hop.duration):>7} {_s(queue):>7} "
           f"{_s(prefill):>7} {_s(decode):>7} {hop.input_tokens:>6} {hop.cached_tokens:>6} "
           f"{hop.new_tokens:>6} {hop.output_tokens:>5} {hop.tokens_per_pass:>8.2f}")
    notes = []
    if hop.num_tool_calls:
        notes.append(f"{hop.num_tool_calls} tool call{'s' if hop.num_tool_calls > 1 else ''}")
    if hop.error:
        notes.append(f"error: {hop.error}")
    return row + (f"  ({'; '.join(notes)})" if notes else "")


def _tool_row(tool: ToolSpan) -> str:
    row = (f"  {tool.name[:28]:<28} {_s(tool.start):>7} {_s(tool.duration):>7}  "
           f"{tool.status:<8} {tool.retries:>7}")
    return row + (f"  {tool.error[:80]}" if tool.error and tool.status != "ok" else "")


def summary_table(snapshot: Snapshot) -> str:
    """The table (module docstring); ``"(nothing recorded)"`` when empty."""
    runs = snapshot.runs()
    if not runs:
        return "(nothing recorded)"
    lines: list[str] = []
    for run in runs:
        lines.append(f"run {run.name}: {len(run.hops)} hops, {len(run.tools)} tool calls, "
                     f"{len(run.retrievals)} retrievals (seconds)")
        if run.hops:
            lines.append(_HOP_HEAD)
            lines.extend(_hop_row(run, hop) for hop in run.hops)
        if run.retrievals:
            lines.append(f"  {'retrieval':<28} {'start':>7} {'total':>7}  {'docs':>8}")
            for r in run.retrievals:
                tail = f"  error: {r.error}" if r.error else f"  {r.query[:60]!r}"
                lines.append(f"  {r.name[:28]:<28} {_s(r.start):>7} {_s(r.duration):>7}  "
                             f"{r.num_documents:>8}{tail}")
        if run.tools:
            lines.append(f"  {'tool':<28} {'start':>7} {'total':>7}  {'status':<8} {'retries':>7}")
            lines.extend(_tool_row(tool) for tool in sorted(run.tools, key=lambda t: t.start))
        lines.append("")
    hops = [h for run in runs for h in run.hops]
    tools = [t for run in runs for t in run.tools]
    prompt = sum(h.input_tokens for h in hops)
    cached = sum(h.cached_tokens for h in hops)
    share = f"{100 * cached / prompt:.0f}%" if prompt else "-"
    statuses = {s: sum(t.status == s for t in tools) for s in ("ok", "error", "timeout")}
    lines.append(
        f"total: {len(hops)} hops {sum(h.duration for h in hops):.3f}s, "
        f"prompt tokens {prompt} ({cached} cached, {share}), "
        f"output tokens {sum(h.output_tokens for h in hops)}; "
        f"{len(tools)} tool calls {sum(t.duration for t in tools):.3f}s "
        f"({', '.join(f'{n} {s}' for s, n in statuses.items() if n) or 'none'}); "
        f"wall {snapshot.end:.3f}s")
    return "\n".join(lines)
