"""Answers the front builds from every replica's: Prometheus text labelled by replica, and
one health verdict (pure; no Ray)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["REPLICA_LABEL", "health_summary", "merge_metrics"]

REPLICA_LABEL = "replica"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else f"{float(value):.1f}"


def merge_metrics(texts: Mapping[str, str]) -> str:
    """One Prometheus text exposition of every replica's, each sample labelled ``replica``.

    Args:
        texts: Replica id -> that replica's ``GET /metrics`` text.

    Returns:
        The families in first-seen order, each with its ``# HELP`` / ``# TYPE`` once and the
        samples of every replica under it (Prometheus wants a family's samples together).
    """
    families: dict[str, dict[str, Any]] = {}
    for replica in sorted(texts):
        for family in text_string_to_metric_families(texts[replica]):
            entry = families.setdefault(family.name, {
                "type": family.type, "help": family.documentation, "lines": []})
            for sample in family.samples:
                labels = {REPLICA_LABEL: replica, **{k: v for k, v in sample.labels.items()
                                                     if k != REPLICA_LABEL}}
                shown = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                entry["lines"].append(f"{sample.name}{{{shown}}} {_number(sample.value)}")
    out: list[str] = []
    for name, entry in families.items():
        if entry["type"] == "counter" and not name.endswith("_total"):
            name = f"{name}_total"  # the text format names a counter by its sample
        out.append(f"# HELP {name} {_escape(entry['help'])}")
        out.append(f"# TYPE {name} {entry['type']}")
        out.extend(entry["lines"])
    return "\n".join(out) + "\n" if out else ""


def health_summary(results: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """The front's ``/health``: 200 when every replica answered 200 (and there is one).

    Args:
        results: Replica id -> its ``GET /health`` status code, or the exception raised
            asking it.

    Returns:
        ``(status, body)``: 200 or 503, and ``{"status", "replicas": {id: status or error}}``.
    """
    shown = {rid: (res if isinstance(res, int) else f"{type(res).__name__}: {res}"[:200])
             for rid, res in sorted(results.items())}
    healthy = bool(results) and all(res == 200 for res in results.values())
    body = {"status": "ok" if healthy else "unavailable", "replicas": shown}
    if not results:
        body["reason"] = "no replica is running"
    return (200 if healthy else 503), body
