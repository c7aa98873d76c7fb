"""The front's merged /metrics (labelled by replica) and /health verdict."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from langchain_ascend.serve.ray.merge import health_summary, merge_metrics  # noqa: E402

TEXT = """# HELP reqs_total requests
# TYPE reqs_total counter
reqs_total{endpoint="/v1/chat/completions",status="200"} 3.0
# HELP running requests running
# TYPE running gauge
running 1.0
# HELP ttft time to first token
# TYPE ttft histogram
ttft_bucket{le="0.5"} 1.0
ttft_bucket{le="+Inf"} 2.0
ttft_count 2.0
ttft_sum 0.75
"""


def test_every_sample_is_labelled_by_its_replica_and_families_stay_together():
    merged = merge_metrics({"r2": TEXT.replace("3.0", "5.0"), "r1": TEXT})
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert set(families) == {"reqs", "running", "ttft"}
    reqs = {(s.labels["replica"], s.labels["status"]): s.value for s in families["reqs"].samples}
    assert reqs == {("r1", "200"): 3.0, ("r2", "200"): 5.0}
    assert {s.labels["replica"] for s in families["running"].samples} == {"r1", "r2"}
    buckets = [s for s in families["ttft"].samples if s.name == "ttft_bucket"]
    assert {(s.labels["replica"], s.labels["le"]) for s in buckets} == {
        ("r1", "0.5"), ("r1", "+Inf"), ("r2", "0.5"), ("r2", "+Inf")}
    assert merged.count("# TYPE ttft histogram") == 1


def test_no_replica_is_an_empty_exposition():
    assert merge_metrics({}) == ""


def test_health_is_ok_only_when_every_replica_is():
    assert health_summary({"a": 200, "b": 200}) == (
        200, {"status": "ok", "replicas": {"a": 200, "b": 200}})
    status, body = health_summary({"a": 200, "b": 503})
    assert status == 503 and body["replicas"]["b"] == 503
    status, body = health_summary({"a": RuntimeError("actor died")})
    assert status == 503 and body["replicas"]["a"] == "RuntimeError: actor died"
    status, body = health_summary({})
    assert status == 503 and body["reason"] == "no replica is running"
