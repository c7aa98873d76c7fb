"""Where an agent's time goes: :class:`AscendTimeline`, a callback handler that records each
hop (queue, prefill of new vs cached tokens, decode), tool call and retrieval, and writes a
Chrome / Perfetto trace, a PNG chart and a text summary.

No torch and no matplotlib at import: the chart imports matplotlib when it draws.
"""

from __future__ import annotations

from langchain_ascend.observe.records import HopSpan, RetrievalSpan, Segment, Snapshot, ToolSpan
from langchain_ascend.observe.timeline import AscendTimeline

__all__ = ["AscendTimeline", "HopSpan", "RetrievalSpan", "Segment", "Snapshot", "ToolSpan"]
