"""PrefixAffinityRouter: Ray's RequestRouter over rank_replicas (no Ray cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("ray.serve", reason="the router needs the 'ray' extra")
from ray.serve._private.common import (  # noqa: E402
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest  # noqa: E402

from langchain_ascend.errors import InvalidRequestError  # noqa: E402
from langchain_ascend.serve.ray.router import PrefixAffinityRouter  # noqa: E402
from langchain_ascend.serve.ray.routing import rendezvous_order  # noqa: E402

DEPLOYMENT = DeploymentID(name="AscendEngine", app_name="ascend")


@dataclass
class FakeReplica:
    """What the router reads of a running replica."""

    replica_id: ReplicaID
    max_ongoing_requests: int = 8


def _router(saturation=None) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)
    router.initialize_state(saturation=saturation)
    return router


def _replicas(*ids: str) -> list[FakeReplica]:
    return [FakeReplica(ReplicaID(unique_id=rid, deployment_id=DEPLOYMENT)) for rid in ids]


def _pending(key) -> PendingRequest:
    metadata = RequestMetadata(request_id="r", internal_request_id="i")
    return PendingRequest(args=[], kwargs={"routing_key": key}, metadata=metadata)


def _ids(ranks) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


async def test_a_key_goes_to_its_rendezvous_replica_first():
    replicas = _replicas("a", "b", "c")
    preferred, *rest = rendezvous_order("prefix:k", ["a", "b", "c"])
    pending = _pending("prefix:k")
    ranks = _ids(await _router().choose_replicas(replicas, pending))
    assert ranks[0] == [preferred] and sorted(ranks[1]) == sorted(rest)
    assert pending.routing_context.should_backoff  # every replica offered: back off if full


async def test_a_saturated_replica_yields_to_the_least_loaded():
    replicas = _replicas("a", "b", "c")
    preferred, *rest = rendezvous_order("prefix:k", ["a", "b", "c"])
    router = _router(saturation=2)
    cache = router.replica_queue_len_cache
    cache.update(ReplicaID(preferred, DEPLOYMENT), 2)
    cache.update(ReplicaID(rest[0], DEPLOYMENT), 1)
    cache.update(ReplicaID(rest[1], DEPLOYMENT), 0)
    ranks = _ids(await router.choose_replicas(replicas, _pending("prefix:k")))
    assert ranks == [[rest[1], rest[0]], [preferred]]


async def test_saturation_defaults_to_max_ongoing_requests():
    replicas = _replicas("a", "b")
    preferred = rendezvous_order("prefix:k", ["a", "b"])[0]
    router = _router()
    router.replica_queue_len_cache.update(ReplicaID(preferred, DEPLOYMENT), 7)
    assert _ids(await router.choose_replicas(replicas, _pending("prefix:k")))[0] == [preferred]
    router.replica_queue_len_cache.update(ReplicaID(preferred, DEPLOYMENT), 8)
    assert _ids(await router.choose_replicas(replicas, _pending("prefix:k")))[-1] == [preferred]


async def test_no_key_is_one_rank_and_no_replica_is_none():
    assert len(_ids(await _router().choose_replicas(_replicas("a", "b"), _pending(None)))) == 1
    assert len(_ids(await _router().choose_replicas(_replicas("a", "b"), None))) == 1
    assert await _router().choose_replicas([], _pending("prefix:k")) == []


def test_saturation_is_checked():
    with pytest.raises(InvalidRequestError, match="saturation"):
        _router(saturation=0)
