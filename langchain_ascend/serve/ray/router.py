"""Ray Serve's request router for the engine replicas: prefix affinity, least-loaded fallback.

Ray Serve lets a deployment name its own ``RequestRouter`` (``request_router_config``); every
``DeploymentHandle`` to that deployment routes through it. Ours reads the routing key the front
deployment passed (``routing_key=`` on the call) and ranks replicas with
:func:`~langchain_ascend.serve.ray.routing.rank_replicas`: the key's rendezvous replica first,
then the others least-loaded first. Ray's base router does the rest: it probes (or reads its
cache of) each replica's in-flight requests, takes the least loaded replica of the first rank
that has room below ``max_ongoing_requests``, and backs off while every replica is full.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from langchain_ascend.serve.ray.routing import rank_replicas
from langchain_ascend.validation import check_count

__all__ = ["ROUTING_KEY_KWARG", "PrefixAffinityRouter"]

ROUTING_KEY_KWARG = "routing_key"
"""The keyword argument of a replica call that carries its routing key."""


class PrefixAffinityRouter(RequestRouter):
    """Routes each call to the replica its routing key hashes to, unless that one is saturated.

    Configured through ``request_router_kwargs``: ``saturation`` (in-flight requests at which
    the preferred replica is passed over for the least-loaded other; default: the replica's
    ``max_ongoing_requests``, where Ray itself stops sending).
    """

    def initialize_state(self, saturation: int | None = None, **kwargs) -> None:
        """Keep the saturation bound (Ray calls this once, with ``request_router_kwargs``)."""
        super().initialize_state(**kwargs)
        self.saturation = check_count("saturation", saturation, allow_none=True)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Ranks of replicas for one pending call, most preferred first."""
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        if not by_id:
            return []
        key = None
        if pending_request is not None:
            key = pending_request.kwargs.get(ROUTING_KEY_KWARG)
            # Every replica is in the ranks: when none had room, wait before the next round.
            pending_request.routing_context.should_backoff = True
        cache = self.replica_queue_len_cache
        queue_lens = {rid: cache.get(replica.replica_id) for rid, replica in by_id.items()}
        saturation = self.saturation or min(r.max_ongoing_requests for r in by_id.values())
        ranks = rank_replicas(key if isinstance(key, str) else None, list(by_id), queue_lens,
                              saturation)
        return [[by_id[rid] for rid in rank] for rank in ranks]
