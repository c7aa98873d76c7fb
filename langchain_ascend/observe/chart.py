"""The timeline as a Gantt-style PNG: one row per track, runs stacked top to bottom.

Hops are drawn as their phases (other / queue / prefill / decode, one colour each) and labelled
with their tokens (``hop 2: 812 in, 640 cached -> 24 out``); tool calls are coloured by status
and labelled with the tool's name (and retries); retrievals with their document count. The x
axis is seconds since the timeline's first event. matplotlib (the ``plot`` extra) is imported
here only, when drawing, on the Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_ascend.extras import PLOT, import_extra
from langchain_ascend.observe.records import HopSpan, RetrievalSpan, Snapshot, ToolSpan

PHASE_COLOURS = {"other": "#c7c7c7", "queue": "#f2b134", "prefill": "#e4572e",
                 "decode": "#2e86ab"}
STATUS_COLOURS = {"ok": "#4caf50", "error": "#d62728", "timeout": "#9467bd",
                  "running": "#8c8c8c"}
RETRIEVAL_COLOUR = "#17becf"
_LEGEND = [("other (template, tokenize, reply)", PHASE_COLOURS["other"]),
           ("queue", PHASE_COLOURS["queue"]), ("prefill (new tokens)", PHASE_COLOURS["prefill"]),
           ("decode", PHASE_COLOURS["decode"]), ("tool ok", STATUS_COLOURS["ok"]),
           ("tool error", STATUS_COLOURS["error"]), ("tool timeout", STATUS_COLOURS["timeout"]),
           ("retrieval", RETRIEVAL_COLOUR)]
_BAR_HEIGHT = 0.6
#: A 7-point character's width as a share of the x range (12-inch figure, ~10.5 in of axes).
_CHAR_WIDTH = 0.0052


def _end(span: HopSpan | ToolSpan | RetrievalSpan) -> float:
    return span.end if span.end is not None else span.start


def hop_label(number: int, hop: HopSpan) -> str:
    """``hop 2: 812 in, 640 cached -> 24 out`` (plus tokens per pass when above 1)."""
    text = f"hop {number}: {hop.input_tokens} in, {hop.cached_tokens} cached -> " \
           f"{hop.output_tokens} out"
    if hop.tokens_per_pass > 1.0:
        text += f", {hop.tokens_per_pass:.1f} tok/pass"
    return text + (" (error)" if hop.error else "")


def tool_label(tool: ToolSpan) -> str:
    """The tool's name, its status when not ok, and its retries."""
    text = tool.name
    if tool.status != "ok":
        text += f" [{tool.status}]"
    if tool.retries:
        text += f" ({tool.retries} {'retry' if tool.retries == 1 else 'retries'})"
    return text


def write_png(snapshot: Snapshot, path: Path, *, title: str | None = None,
              dpi: int = 120) -> Path:
    """Draw ``snapshot`` into ``path`` (parent folders created); returns ``path``.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install
            'langchain-ascend[plot]'``); an ``ImportError``.
    """
    matplotlib = import_extra("matplotlib", extra=PLOT, feature="the timeline chart (PNG)")
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    runs = snapshot.runs()
    rows = [(run, track) for run in runs for track in run.tracks]
    span_s = max(snapshot.end, 1e-3)
    height = 2.2 + 0.5 * max(len(rows), 1)
    fig = Figure(figsize=(12, height), dpi=dpi)
    ax = fig.add_subplot(1, 1, 1)
    labels: list[str] = []
    previous_run = None
    for y, (run, track) in enumerate(rows):
        labels.append(f"{run.name} · {track.label}" if len(runs) > 1 else track.label)
        if previous_run is not None and run is not previous_run:
            ax.axhline(y - 0.5, color="#555555", linewidth=0.8)
        previous_run = run
        label_end = float("-inf")  # labels on this row may not overlap: later ones are dropped
        for span in track.spans:
            label_end = _draw_span(ax, y, span,
                                   run.hop_number(span) if isinstance(span, HopSpan) else 0,
                                   span_s, label_end)
    if not rows:
        ax.text(0.5, 0.5, "nothing recorded", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.5, -0.9)  # room above the first row for its labels
    ax.set_xlim(0, span_s * 1.02)
    ax.set_xlabel("seconds since the first event")
    ax.grid(axis="x", linestyle=":", linewidth=0.6)
    hops = [h for run in runs for h in run.hops]
    tools = [t for run in runs for t in run.tools]
    prompt = sum(h.input_tokens for h in hops)
    cached = sum(h.cached_tokens for h in hops)
    subtitle = (f"{len(hops)} hops, {len(tools)} tool calls, {snapshot.end:.2f} s; prompt "
                f"tokens {prompt} ({100 * cached / prompt:.0f}% from the prefix cache)"
                if prompt else f"{len(hops)} hops, {len(tools)} tool calls, "
                               f"{snapshot.end:.2f} s")
    ax.set_title(f"{title or 'Agent timeline'}\n{subtitle}", fontsize=10)
    fig.legend(handles=[Patch(color=c, label=n) for n, c in _LEGEND], loc="lower center",
               ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1))  # the legend's two lines below
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png")
    return path


def _draw_span(ax: Any, y: int, span: HopSpan | ToolSpan | RetrievalSpan, number: int,
               span_s: float, label_end: float) -> float:
    """Draw ``span`` on row ``y``; its label unless it would overlap the previous one (which
    ends at ``label_end``). Returns where this row's labels now end."""
    start, end = span.start, _end(span)
    width = max(end - start, span_s * 0.002)  # a zero-length call stays visible
    if isinstance(span, HopSpan):
        for seg in span.segments() or []:
            ax.barh(y, max(seg.end - seg.start, span_s * 0.001), left=seg.start,
                    height=_BAR_HEIGHT, color=PHASE_COLOURS[seg.kind], edgecolor="none")
        if not span.segments():
            ax.barh(y, width, left=start, height=_BAR_HEIGHT, color=PHASE_COLOURS["other"])
        ax.barh(y, width, left=start, height=_BAR_HEIGHT, fill=False, edgecolor="#333333",
                linewidth=0.6)
        text = hop_label(number, span)
    elif isinstance(span, ToolSpan):
        ax.barh(y, width, left=start, height=_BAR_HEIGHT, color=STATUS_COLOURS[span.status],
                edgecolor="#333333", linewidth=0.6)
        text = tool_label(span)
    else:
        ax.barh(y, width, left=start, height=_BAR_HEIGHT, color=RETRIEVAL_COLOUR,
                edgecolor="#333333", linewidth=0.6)
        text = f"{span.name}: {span.num_documents} docs" + (" (error)" if span.error else "")
    text_width = len(text) * _CHAR_WIDTH * span_s
    if width > span_s * 0.25:  # wide: inside the bar
        ax.text(start + span_s * 0.004, y, text, va="center", ha="left", fontsize=7,
                color="white", clip_on=True)
        return max(label_end, start)
    if start > span_s * 0.7:  # near the right edge: above the bar, ending at its end
        left, right = start + width - text_width, start + width
        if left < label_end:
            return label_end
        ax.text(right, y - _BAR_HEIGHT / 2 - 0.03, text, va="bottom", ha="right",
                fontsize=7, color="#222222", clip_on=True)
        return right
    if start < label_end:
        return label_end
    ax.text(start, y - _BAR_HEIGHT / 2 - 0.03, text, va="bottom", ha="left", fontsize=7,
            color="#222222", clip_on=True)  # above the bar, from its start
    return start + text_width
