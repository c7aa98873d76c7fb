"""Which replica serves a request: a stable routing key and a replica ranking (pure, no Ray).

A multi-hop agent sends a growing conversation: every hop repeats the system prompt, the tool
schemas and the earlier turns. The engine's prefix cache makes that repetition nearly free, but
only on the replica that computed it. So each request gets a **routing key** that stays the same
across an agent's hops:

* the ``X-Session-Id`` header when the client sends one (an explicit session wins);
* else, for a chat completion, a hash of the model name, the leading system (or developer)
  messages and the first user message — the part of the prompt every later hop starts with;
* else no key (``/v1/models``, ``/health``, embeddings): any replica will do.

Replicas are chosen by **rendezvous hashing** (highest random weight): each replica id scores
``hash(key, replica id)`` and the highest score is the key's preferred replica. When a replica
leaves or joins, only the keys it owned (or wins) move; every other key keeps its replica and
its cache. When the preferred replica is **saturated** (its in-flight requests reach the
saturation bound), the request goes to the least-loaded other replica instead.

:func:`rank_replicas` returns ranks in the shape Ray Serve's ``RequestRouter.choose_replicas``
returns (a list of lists, most preferred first; the router takes the least-loaded replica of
the first rank that has room), so the Ray-facing router is a thin adapter over it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_ascend.validation import check_count

__all__ = [
    "SESSION_HEADER",
    "rank_replicas",
    "rendezvous_order",
    "routing_key",
]

SESSION_HEADER = "x-session-id"
"""The header naming an explicit session (compared case-insensitively, as HTTP headers are)."""

_LEADING_ROLES = frozenset({"system", "developer"})


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """The value of header ``name`` (case-insensitive), stripped; ``None`` when absent or blank."""
    if not headers:
        return None
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name and isinstance(value, str):
            return value.strip() or None
    return None


def _prefix_messages(messages: Sequence[Any]) -> list[list[Any]] | None:
    """``[role, content]`` of the leading system/developer messages and the first user message.

    ``None`` when there is no user message before the first other role (nothing an agent's
    later hops would share reliably) or when the messages are not OpenAI message objects.
    """
    prefix: list[list[Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role = message.get("role")
        if role in _LEADING_ROLES:
            prefix.append([role, message.get("content")])
            continue
        if role == "user":
            prefix.append([role, message.get("content")])
            return prefix
        return None
    return None


def routing_key(body: Any, headers: Mapping[str, str] | None = None) -> str | None:
    """The stable routing key of one request, or ``None`` when any replica will do.

    Args:
        body: The request's decoded JSON body (``None`` for a request without one). Only a
            mapping with a ``messages`` list (a chat completion) yields a content key.
        headers: The request's headers; ``X-Session-Id`` (any case) overrides the content key.

    Returns:
        ``"session:<id>"`` for an explicit session, ``"prefix:<sha256 hex>"`` of the model, the
        leading system messages and the first user message for a chat completion, else ``None``.

    >>> routing_key({}, {"X-Session-Id": "agent-7"})
    'session:agent-7'
    >>> a = routing_key({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    >>> b = routing_key({"model": "m", "messages": [{"role": "user", "content": "hi"},
    ...     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]})
    >>> a == b and a.startswith("prefix:")
    True
    """
    session = _header(headers, SESSION_HEADER)
    if session is not None:
        return f"session:{session}"
    if not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    prefix = _prefix_messages(messages)
    if prefix is None:
        return None
    model = body.get("model")
    canonical = json.dumps(
        [model if isinstance(model, str) else None, prefix],
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=repr,
    )
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"prefix:{digest}"


def _score(key: str, replica_id: str) -> int:
    """The rendezvous weight of ``replica_id`` for ``key``: 64 bits of a keyed hash.

    A cryptographic hash, not Python's ``hash()`` (salted per process): every router process
    (one per front replica) must rank replicas the same way.
    """
    digest = hashlib.blake2b(
        replica_id.encode("utf-8", "surrogatepass"),
        key=hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest(),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` from the key's most to least preferred (ties broken by id).

    >>> rendezvous_order("k", ["a", "b", "c"]) == rendezvous_order("k", ["c", "a", "b"])
    True
    """
    unique = sorted(set(replica_ids))
    return sorted(unique, key=lambda rid: (-_score(key, rid), rid))


def _least_loaded(replica_ids: Sequence[str], queue_lens: Mapping[str, int | None]) -> list[str]:
    """``replica_ids`` ordered by known in-flight requests (unknown counts as 0), then by id."""
    return sorted(replica_ids, key=lambda rid: (queue_lens.get(rid) or 0, rid))


def rank_replicas(
    key: str | None,
    replica_ids: Sequence[str],
    queue_lens: Mapping[str, int | None],
    saturation: int,
) -> list[list[str]]:
    """Ranks of replicas for one request, most preferred first.

    Args:
        key: The request's routing key (:func:`routing_key`); ``None`` for any replica.
        replica_ids: The running replicas' ids.
        queue_lens: In-flight requests per replica as last seen; a missing or ``None``
            entry is unknown (the caller probes it), never treated as saturated.
        saturation: In-flight requests at which the preferred replica counts as saturated
            (an integer >= 1, else ``InvalidRequestError``).

    Returns:
        With a key: ``[[preferred], others]`` — or ``[others, [preferred]]`` when the
        preferred replica is saturated — where ``others`` is every other replica, least
        loaded first (Ray's router takes the least loaded of a rank that has room). Without a
        key: one rank of every replica, least loaded first. ``[]`` without replicas.

    >>> rank_replicas("k", ["a"], {}, 4)
    [['a']]
    >>> rank_replicas(None, ["a", "b"], {"a": 3, "b": 1}, 4)
    [['b', 'a']]
    """
    check_count("saturation", saturation)
    if not replica_ids:
        return []
    if key is None:
        return [_least_loaded(sorted(set(replica_ids)), queue_lens)]
    preferred, *rest = rendezvous_order(key, replica_ids)
    others = _least_loaded(rest, queue_lens)
    load = queue_lens.get(preferred)
    if load is not None and load >= saturation:
        return [others, [preferred]] if others else [[preferred]]
    return [[preferred], others] if others else [[preferred]]
