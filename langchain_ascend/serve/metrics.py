"""Prometheus metrics of one app, in a registry of its own (two apps in one process, as in
the tests, never share counters).

Counted as requests happen: requests by endpoint and status, prompt / cached / generated
tokens, time to first token and the gaps between streamed tokens. Read from the engine at
each scrape (``engine.stats()``): running and waiting requests, KV blocks in use and in all,
and the agent sessions' retention (retained sessions and blocks, hits after a tool call,
tokens recomputed, tokens prefilled while tools ran).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langchain_ascend.serve.web import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFIX = "langchain_ascend"
ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/agent",
                       "/health", "/metrics"})
SESSION_GAUGES = {  # gauge name: (EngineStats field, help)
    "retained_sessions": ("num_retained_sessions",
                          "agent sessions whose KV blocks are kept while their tools run"),
    "retained_kv_blocks": ("num_retained_blocks",
                           "free KV blocks retained for parked sessions (at most the cap)"),
    "retention_cap_kv_blocks": ("retention_cap_blocks", "most KV blocks retained sessions "
                                "may hold"),
    "session_resumes": ("num_resumed", "hops after a tool call (total)"),
    "session_resume_hits": ("num_resume_hits", "hops after a tool call whose prefix was "
                            "still cached (total)"),
    "session_recomputed_tokens": ("num_recomputed_tokens", "prompt tokens of a session "
                                  "prefilled again (total)"),
    "tool_time_prefilled_tokens": ("num_background_tokens", "tokens prefilled while tools "
                                   "ran (total)"),
    "template_fallbacks": ("num_template_fallbacks", "hops prefilled one-shot: template not "
                           "prefix-stable (total)"),
}
"""Agent-session gauges read from ``engine.stats()`` at each scrape (``engine.core.retention``);
the running totals are gauges because the engine owns the counts."""
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """The app's counters, gauges and histograms.

    Args:
        engine_stats: Returns the engine's ``EngineStats`` (None while there is no engine).
        in_flight: Returns the requests the server holds (admitted, not yet answered).
    """

    def __init__(self, engine_stats: Callable[[], Any], in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.engine_stats = engine_stats
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests answered, by endpoint "
                                "and status", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}_cached_prompt_tokens",
                                     "prompt tokens served from the prefix cache", registry=r)
        self.generated_tokens = Counter(f"{PREFIX}_generated_tokens", "tokens generated",
                                        registry=r)
        self.running = Gauge(f"{PREFIX}_requests_running", "requests in the engine's batch",
                             registry=r)
        self.waiting = Gauge(f"{PREFIX}_requests_waiting", "requests queued in the engine",
                             registry=r)
        self.in_flight = Gauge(f"{PREFIX}_server_requests_in_flight",
                               "requests the server has admitted and not yet answered",
                               registry=r)
        self.in_flight.set_function(lambda: float(in_flight()))
        self.kv_blocks_used = Gauge(f"{PREFIX}_kv_blocks_used", "KV-cache blocks held by "
                                    "live requests", registry=r)
        self.kv_blocks_total = Gauge(f"{PREFIX}_kv_blocks_total", "KV-cache blocks in the pool",
                                     registry=r)
        self.sessions = {name: Gauge(f"{PREFIX}_{name}", text, registry=r)
                         for name, (_, text) in SESSION_GAUGES.items()}
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "request arrival to "
                              "its first streamed token", buckets=_TTFT_BUCKETS, registry=r)
        self.inter_token = Histogram(f"{PREFIX}_inter_token_seconds", "gap between streamed "
                                     "chunks of a reply", buckets=_GAP_BUCKETS, registry=r)

    def count_request(self, path: str, status: int) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def count_usage(self, usage: Mapping[str, Any] | None) -> None:
        """Add one reply's LangChain ``usage_metadata``."""
        if not usage:
            return
        self.prompt_tokens.inc(int(usage.get("input_tokens", 0)))
        self.generated_tokens.inc(int(usage.get("output_tokens", 0)))
        details = usage.get("input_token_details") or {}
        self.cached_tokens.inc(int(details.get("cache_read", 0) or 0))

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition (engine gauges refreshed) and its content type."""
        stats = self.engine_stats()
        if stats is not None:
            self.running.set(stats.num_running)
            self.waiting.set(stats.num_waiting)
            self.kv_blocks_used.set(stats.num_blocks_used)
            self.kv_blocks_total.set(stats.num_blocks_total)
            for name, gauge in self.sessions.items():
                gauge.set(getattr(stats, SESSION_GAUGES[name][0]))
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
