"""The front door to the block pool: per-request block tables and prefix caching.

Pure Python, no torch. The scheduler asks three questions of this class:

* :meth:`KVCacheManager.get_computed_blocks` - how much of a new request's prefix is cached?
* :meth:`KVCacheManager.allocate_slots` - can the request get slots for ``n`` more tokens?
  (all or nothing: on ``None`` nothing changed)
* :meth:`KVCacheManager.free` - the request finished, was aborted or preempted.

and after each step it calls :meth:`KVCacheManager.cache_blocks` so newly *computed* full
blocks (prompt or generated tokens) become reusable by later requests.

Sessions (``engine.core.retention``): when a request of a session is freed, its table and
computed tokens are remembered as the session's last state; :meth:`KVCacheManager.park`
retains that table while the session's tools run, and :meth:`record_session_admission`
counts, for the session's next request, the tokens it recomputes (of its last state, those
the prefix cache no longer had) and whether it resumed on a retained prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_ascend.engine.core.block_pool import (
    BlockPool,
    HashFn,
    KVBlock,
    RelocateFn,
    hash_block_tokens,
)
from langchain_ascend.engine.core.request import Request
from langchain_ascend.engine.core.retention import RetentionTable, ttl_for
from langchain_ascend.int_math import cdiv
from langchain_ascend.validation import check_count

MAX_REMEMBERED_SESSIONS = 4096
"""Sessions whose last state is remembered (least recently used forgotten first)."""


@dataclass
class SessionState:
    """A session's last finished request: its block table and its computed tokens."""

    block_ids: list[int]
    token_ids: list[int]


@dataclass
class SessionCounters:
    """What sessions did to the cache (``EngineStats`` reports them).

    Attributes:
        num_resumed: Session requests admitted while their session was parked.
        num_resume_hits: Of those, requests whose hit covered every full block of the prefix
            they share with the session's last state.
        num_recomputed_tokens: Tokens of a session's last state prefilled again.
        num_background_tokens: Tokens prefilled by background (tool-time) requests.
        num_template_fallbacks: Hops prefilled one-shot: template not prefix-stable.
    """

    num_resumed: int = 0
    num_resume_hits: int = 0
    num_recomputed_tokens: int = 0
    num_background_tokens: int = 0
    num_template_fallbacks: int = 0


class KVCacheManager:
    """Block tables of live requests over one :class:`BlockPool`.

    Args:
        num_blocks: Blocks in the device cache.
        block_size: Token slots per block.
        enable_prefix_caching: Reuse full blocks across requests; False makes every request
            compute its whole prompt.
        hash_fn: Chained block hash (tests pass a weak one to force collisions).
        relocate: Copies one block's K/V into another on the device (see :class:`BlockPool`).
        retention: The parked sessions' table (cap, tool latency estimates).
        clock: Time source for TTLs.

    Invariants:
        * ``req_to_blocks[id]`` covers at least the request's allocated tokens, in order.
        * The first ``req_to_num_cached_blocks[id]`` blocks of a request are registered in the
          pool's hash map (or were already cached when it hit them).
        * A prefix hit never covers a request's last token: its logits must be computed.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
        relocate: RelocateFn | None = None,
        retention: RetentionTable | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        check_count("block_size", block_size)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, relocate=relocate, retention=retention, clock=clock)
        self.sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.session_counters = SessionCounters()
        self._hash_fn = hash_fn
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.req_to_num_cached_blocks: dict[str, int] = {}
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole pool holds: no request can grow beyond this."""
        return self.pool.num_blocks * self.block_size

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (empty when it holds none)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def update_block_hashes(self, request: Request) -> None:
        """Extend ``request.block_hashes`` over every full block of its known tokens."""
        size = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        for index in range(len(hashes), len(tokens) // size):
            parent = hashes[index - 1] if index else None
            hashes.append(self._hash_fn(parent, tokens[index * size:(index + 1) * size]))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of a request not yet holding blocks.

        The hit stops at the first missing or mismatching block and is capped so at least the
        last token is computed again (its logits give the next token).

        Returns:
            The hit blocks (not yet referenced: pass them to :meth:`allocate_slots`) and the
            number of tokens they cover.
        """
        if not self.enable_prefix_caching:
            return [], 0
        self.update_block_hashes(request)
        size = self.block_size
        tokens = request.all_token_ids
        max_blocks = (request.num_tokens - 1) // size
        hits: list[KVBlock] = []
        for index in range(max_blocks):
            parent = request.block_hashes[index - 1] if index else None
            block = self.pool.lookup(
                request.block_hashes[index], parent, tokens[index * size:(index + 1) * size]
            )
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * size

    def record_prefix_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup in the hit-rate statistics."""
        if self.enable_prefix_caching:
            self.num_queried_tokens += num_queried_tokens
            self.num_hit_tokens += num_hit_tokens

    def num_blocks_needed(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock] = ()
    ) -> int:
        """Free blocks :meth:`allocate_slots` would consume (hit blocks on a free list count)."""
        held = self.req_to_blocks.get(request.request_id, ())
        num_tokens = (request.num_computed_tokens + len(new_computed_blocks) * self.block_size
                      + num_new_tokens)
        num_new_blocks = max(cdiv(num_tokens, self.block_size) - len(held)
                             - len(new_computed_blocks), 0)
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return num_new_blocks + num_revived

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock] = ()
    ) -> list[KVBlock] | None:
        """Give the request slots for ``num_new_tokens`` more tokens.

        Args:
            request: Its ``num_computed_tokens`` must not yet include ``new_computed_blocks``.
            num_new_tokens: Tokens to compute this step.
            new_computed_blocks: Prefix-cache hits from :meth:`get_computed_blocks` (only at a
                request's (re)admission).

        Returns:
            The newly allocated blocks (possibly empty), or None - with nothing changed - when
            the pool cannot supply them.
        """
        if self.num_blocks_needed(request, num_new_tokens, new_computed_blocks) > (
            self.pool.num_free_blocks
        ):
            return None
        rid = request.request_id
        blocks = self.req_to_blocks.setdefault(rid, [])
        if new_computed_blocks:
            if blocks:
                raise RuntimeError(f"request {rid} already holds blocks; hits only at admission")
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.req_to_num_cached_blocks[rid] = len(new_computed_blocks)
        num_tokens = (request.num_computed_tokens + len(new_computed_blocks) * self.block_size
                      + num_new_tokens)
        num_new_blocks = max(cdiv(num_tokens, self.block_size) - len(blocks), 0)
        new_blocks = self.pool.allocate(num_new_blocks,
                                        after=blocks[-1].block_id if blocks else None)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request) -> None:
        """Register the request's full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if not blocks:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        start = self.req_to_num_cached_blocks.get(rid, 0)
        if num_full <= start:
            return
        self.update_block_hashes(request)
        size = self.block_size
        tokens = request.all_token_ids
        for index in range(start, num_full):
            parent = request.block_hashes[index - 1] if index else None
            self.pool.cache_block(blocks[index], request.block_hashes[index], parent,
                                  tokens[index * size:(index + 1) * size])
        self.req_to_num_cached_blocks[rid] = num_full

    def trim(self, request: Request) -> list[int]:
        """Give back the blocks past the request's known tokens (they held only rejected
        drafted tokens); returns their ids.

        Such a block was never hashed: :meth:`cache_blocks` registers only full blocks of
        computed tokens, and computed tokens are all known. The request keeps
        ``ceil(num_tokens / block_size)`` blocks, what its next step needs anyway.
        """
        blocks = self.req_to_blocks.get(request.request_id)
        keep = cdiv(request.num_tokens, self.block_size)
        if not blocks or len(blocks) <= keep:
            return []
        tail = blocks[keep:]
        if any(b.block_hash is not None for b in tail):
            raise RuntimeError(f"request {request.request_id}: a block past its known tokens "
                               "is in the prefix cache")
        del blocks[keep:]
        self.pool.free(reversed(tail))
        return [b.block_id for b in tail]

    def free(self, request: Request) -> None:
        """Release the request's blocks; its tail blocks become the first to be evicted.

        A session's request leaves its table and computed tokens as the session's last
        state; if the session is parked (a background prefill ending), the parked table
        grows to this one, deadline kept."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, None)
        self.req_to_num_cached_blocks.pop(rid, None)
        if blocks:
            self.pool.free(reversed(blocks))
        sid = request.session_id
        if sid is None or not blocks or not self.enable_prefix_caching:
            return
        computed = request.all_token_ids[:request.num_computed_tokens]
        last = self.sessions.get(sid)
        if request.prefill_only and last is not None and len(last.token_ids) > len(computed):
            return  # a background prefill shorter than what the session already had
        self.sessions[sid] = SessionState([b.block_id for b in blocks], computed)
        self.sessions.move_to_end(sid)
        while len(self.sessions) > MAX_REMEMBERED_SESSIONS:
            self.sessions.popitem(last=False)
        parked = self.pool.retention.sessions.get(sid)
        if parked is not None:
            remaining = max(parked.deadline - self.pool.clock(), 0.0)
            self.pool.park_session(sid, self.sessions[sid].block_ids,
                                   expected_s=parked.expected_s, ttl_s=remaining,
                                   returned=parked.returned)

    def park(self, session_id: str, *, tool_names: Sequence[str] = (),
             ttl_s: float | None = None) -> float | None:
        """Retain the session's last table while its tools run; returns the TTL given, or
        None when the session has no last state (nothing to retain).

        Args:
            tool_names: The tools its last hop called: the TTL comes from their measured
                latencies (``ttl_s`` None).
            ttl_s: An explicit TTL (``prompt_cache_retention``), wins over the estimate.
        """
        state = self.sessions.get(session_id)
        if state is None or not self.enable_prefix_caching:
            return None
        expected = self.pool.retention.latency.expected_wait(tool_names)
        ttl = ttl_for(expected) if ttl_s is None else ttl_s
        self.pool.park_session(session_id, state.block_ids, expected_s=min(expected, ttl),
                               ttl_s=ttl)
        return ttl

    def session_stats(self) -> dict[str, object]:
        """The session fields of ``EngineStats`` (retention and recomputation counters)."""
        pool, counters = self.pool, self.session_counters
        retention = pool.retention
        return {
            "num_retained_sessions": len(retention.sessions),
            "num_retained_blocks": pool.num_retained_blocks,
            "retention_cap_blocks": pool.retention_cap_blocks,
            "num_sessions_parked": retention.num_parked,
            "num_sessions_expired": retention.num_expired,
            "num_sessions_given_up": retention.num_given_up,
            "num_resumed": counters.num_resumed,
            "num_resume_hits": counters.num_resume_hits,
            "num_recomputed_tokens": counters.num_recomputed_tokens,
            "num_background_tokens": counters.num_background_tokens,
            "num_template_fallbacks": counters.num_template_fallbacks,
            "tool_latency_s": retention.latency.snapshot(),
        }

    def session_tokens(self, session_id: str) -> list[int] | None:
        """The session's last computed tokens, or None."""
        state = self.sessions.get(session_id)
        return None if state is None else state.token_ids

    def record_session_admission(self, request: Request, num_hit_tokens: int) -> None:
        """Count a (re)admitted session request's recomputation and resume hit, and end its
        session's retention (its blocks are its own again)."""
        sid = request.session_id
        if sid is None or request.prefill_only:  # a background prefill keeps it parked
            return
        parked = self.pool.release_session(sid)
        state = self.sessions.get(sid)
        if state is None:
            return
        shared = common_prefix_length(state.token_ids, request.all_token_ids)
        shared = min(shared, request.num_tokens - 1)
        counters = self.session_counters
        counters.num_recomputed_tokens += max(0, shared - num_hit_tokens)
        if parked:
            counters.num_resumed += 1
            if num_hit_tokens >= (shared // self.block_size) * self.block_size:
                counters.num_resume_hits += 1

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
