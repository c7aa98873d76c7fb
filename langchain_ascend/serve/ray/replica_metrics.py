"""The server's Prometheus metrics, republished per replica through Ray's metrics.

Each replica's app keeps its own Prometheus registry (``GET /metrics`` on that app). Behind
Ray Serve, a scrape of the front reaches one replica at random, so the replicas' figures are
republished as Ray metrics instead: Ray tags each with ``deployment``, ``replica`` and
``application`` and exports them on every node's metrics port with Ray's own (requests,
latencies, queue lengths), where Prometheus scrapes them with Ray's service discovery.

Every sample of the app's text exposition becomes a Ray gauge of the same name prefixed
``ascend_replica_`` (a counter's running total is a gauge's value here; ``rate()`` works on
both), its labels kept as tags. Histograms keep their ``_bucket``/``_sum``/``_count`` series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from ray.serve.metrics import Counter, Gauge, Histogram

__all__ = ["MIRROR_PREFIX", "ReplicaMetrics", "samples_of"]

MIRROR_PREFIX = "ascend_replica_"
_RESERVED = frozenset({"deployment", "replica", "application", "route"})
_LATENCY_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]


def samples_of(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample in a Prometheus text exposition."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in _RESERVED}
            yield sample.name, labels, float(sample.value)


class ReplicaMetrics:
    """One replica's Ray metrics: what it forwarded, and the mirrored app metrics."""

    def __init__(self) -> None:
        self.requests = Counter(f"{MIRROR_PREFIX}forwarded_requests",
                                "requests this replica answered, by HTTP status",
                                tag_keys=("status",))
        self.failures = Counter(f"{MIRROR_PREFIX}forward_failures",
                                "forwarded requests that raised inside the replica")
        self.latency = Histogram(f"{MIRROR_PREFIX}forward_seconds",
                                 "time from a forwarded request to its last byte",
                                 boundaries=_LATENCY_BUCKETS)
        self.gauges: dict[tuple[str, tuple[str, ...]], Gauge] = {}

    def mirror(self, text: str) -> int:
        """Set a gauge per sample of ``text`` (the app's ``/metrics``); returns the count."""
        count = 0
        for name, labels, value in samples_of(text):
            keys = tuple(sorted(labels))
            gauge = self.gauges.get((name, keys))
            if gauge is None:
                gauge = Gauge(f"{MIRROR_PREFIX}{name}", f"the app's {name}",
                              tag_keys=keys or None)  # type: ignore[arg-type]
                self.gauges[(name, keys)] = gauge
            gauge.set(value, tags=labels)
            count += 1
        return count
