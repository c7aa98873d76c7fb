"""The pool of KV-cache blocks: reference counts, free lists, and the prefix-hash map.

Pure Python, no torch: a block here is only an id into the device cache that
``engine/worker/kv_cache.py`` allocates.

Invariants:
    * A block with ``ref_cnt > 0`` is owned by at least one live request and is on no free list.
    * A block with ``ref_cnt == 0`` is on exactly one free list: the *uncached* queue when it
      holds no reusable prefix (never written, or a partial block), else the *cached* LRU list.
    * Allocation takes uncached blocks first (they hold nothing worth keeping), then evicts
      cached ones least-recently-freed first; eviction removes the hash mapping before reuse.
      Given the id of the block a request's table ends with, allocation first tries the
      uncached block right after it, so a request's blocks stay consecutive in the device
      cache where possible (attention then reads them as one view instead of a gather).
      When that block is free but cached, and a ``relocate`` copy function was given, its
      prefix moves to an uncached free block first (the K/V copied, the hash re-pointed,
      nothing evicted): a session that reuses a shared prompt keeps its own blocks right
      after the prompt's even where another session's cached blocks used to follow it.
    * A free cached block that a parked session retains (``engine.core.retention``) sits on
      a third list, the *retained* one, taken only after the uncached and the LRU cached
      lists are empty: then the session with the lowest expected benefit is given up (its
      blocks join the LRU list's front, tail first) and allocation goes on. Retained blocks
      count as free, so retention never blocks an allocation.
    * ``hash -> block`` maps only blocks whose ``block_hash`` is set, one block per hash.
    * A prefix hit is verified against the stored ``(parent_hash, token_ids)`` of the block, so
      a hash collision is a miss, never silently wrong K/V.
"""

from __future__ import annotations

import hashlib
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from langchain_ascend.engine.core.retention import RetainedSession, RetentionTable
from langchain_ascend.validation import check_count

logger = logging.getLogger(__name__)

BlockHash = bytes
HashFn = Callable[[BlockHash | None, Sequence[int]], BlockHash]
# Copies the K/V of block ``src`` into block ``dst`` on the device, now.
RelocateFn = Callable[[int, int], None]

_ROOT_HASH = b"langchain-ascend-kv-root"


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """SHA-256 over the parent block's hash and this block's token ids.

    Chaining makes a block's hash depend on every token before it, so equal hashes mean equal
    prefixes (and a hit is still checked against the stored tokens).
    """
    digest = hashlib.sha256(parent_hash if parent_hash is not None else _ROOT_HASH)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class KVBlock:
    """Bookkeeping for one block of ``block_size`` token slots in the device cache.

    Attributes:
        block_id: Index into the device K/V cache.
        ref_cnt: Live requests whose block table holds this block.
        block_hash: Hash of the full prefix this block completes, when it is cached.
        parent_hash: Hash of the previous block of that prefix (None for the first block).
        token_ids: The block's tokens, stored for hit verification.
        sessions: Parked sessions retaining this block (see ``engine.core.retention``).
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "parent_hash", "token_ids", "sessions")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None
        self.token_ids: tuple[int, ...] = ()
        self.sessions: set[str] = set()

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "plain"
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, {cached})"

    def _clear_hash(self) -> None:
        self.block_hash = None
        self.parent_hash = None
        self.token_ids = ()


class OutOfBlocksError(RuntimeError):
    """Internal: more blocks were requested than are free. Callers check first."""


class BlockPool:
    """All KV blocks, the two free lists and the prefix-hash map.

    Args:
        num_blocks: Blocks in the device cache.
        relocate: Copies one block's K/V into another on the device; enables moving a cached
            free block out of the way of a request's consecutive run (see the module notes).
        retention: The parked sessions' table (default: a fresh one with the default cap).
        clock: Time source for TTLs and the chance a session returns.
    """

    def __init__(self, num_blocks: int, relocate: RelocateFn | None = None, *,
                 retention: RetentionTable | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        check_count("num_blocks", num_blocks)
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> block, first-freed first (a never-written pool: in id order).
        self._free_uncached: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        # block_id -> block, oldest-freed first (the eviction order).
        self._free_cached: OrderedDict[int, KVBlock] = OrderedDict()
        self._hash_to_block: dict[BlockHash, KVBlock] = {}
        # block_id -> block: free cached blocks some parked session retains.
        self._free_retained: dict[int, KVBlock] = {}
        self._relocate = relocate
        self.retention = retention if retention is not None else RetentionTable()
        self.clock = clock if clock is not None else time.monotonic
        self.num_evictions = 0
        self.num_relocations = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (allocatable, cached ones included)."""
        return len(self._free_uncached) + len(self._free_cached) + len(self._free_retained)

    @property
    def num_retained_blocks(self) -> int:
        """Free blocks parked sessions retain (at most :attr:`retention_cap_blocks`)."""
        return len(self._free_retained)

    @property
    def retention_cap_blocks(self) -> int:
        return int(self.retention.cap_fraction * self.num_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks (free or in use) that hold a reusable prefix."""
        return len(self._hash_to_block)

    def eviction_order(self) -> list[int]:
        """Ids of the free blocks in the order :meth:`allocate` hands them out (retained
        blocks last, in the order they were retained: their real order is decided at the time
        by the sessions' expected benefit)."""
        return list(self._free_uncached) + list(self._free_cached) + list(self._free_retained)

    def lookup(
        self, block_hash: BlockHash, parent_hash: BlockHash | None, token_ids: Sequence[int]
    ) -> KVBlock | None:
        """The cached block for this prefix block, or None (also on a hash collision)."""
        block = self._hash_to_block.get(block_hash)
        if block is None:
            return None
        if block.parent_hash != parent_hash or block.token_ids != tuple(token_ids):
            return None
        return block

    def allocate(self, num_blocks: int, after: int | None = None) -> list[KVBlock]:
        """Take ``num_blocks`` free blocks (ref count 1 each), evicting cached ones if needed.

        Args:
            num_blocks: How many.
            after: The id of the block the caller's table ends with: each new block is the
                block right after the previous one when that is free (a cached one only by
                relocating its prefix), else the next in the usual order.

        Raises:
            OutOfBlocksError: Fewer than ``num_blocks`` are free.
        """
        if num_blocks > self.num_free_blocks:
            raise OutOfBlocksError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        taken: list[KVBlock] = []
        for _ in range(num_blocks):
            block = None
            if after is not None:
                block = self._free_uncached.pop(after + 1, None) or self._take_relocated(after + 1)
            if block is None and self._free_uncached:
                _, block = self._free_uncached.popitem(last=False)
            elif block is None:
                while not self._free_cached:  # only retained blocks left: give one session up
                    self._give_up_one()
                _, block = self._free_cached.popitem(last=False)
                self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
            if after is not None:
                after = block.block_id
        return taken

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a reference to cached blocks a request reuses; free ones leave the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                if self._free_cached.pop(block.block_id, None) is None:
                    del self._free_retained[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block, in order.

        Blocks reaching zero join the tail of their free list, so the first block given here
        is evicted before the later ones.
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is not None and block.sessions:
                    self._free_retained[block.block_id] = block
                elif block.block_hash is not None:
                    self._free_cached[block.block_id] = block
                else:
                    self._free_uncached[block.block_id] = block
        self._enforce_cap()

    def cache_block(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        parent_hash: BlockHash | None,
        token_ids: Sequence[int],
    ) -> bool:
        """Register a full, in-use block under its prefix hash.

        Returns:
            True when registered; False when the block is already cached or another block
            holds that hash (the duplicate stays a plain block and is freed as such).
        """
        if block.ref_cnt <= 0:
            raise RuntimeError(f"cannot cache free block {block.block_id}")
        if block.block_hash is not None or block_hash in self._hash_to_block:
            return False
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.token_ids = tuple(token_ids)
        self._hash_to_block[block_hash] = block
        return True

    # ----------------------------------------------------------------- parked sessions

    def park_session(self, session_id: str, block_ids: Sequence[int], *,
                     expected_s: float, ttl_s: float, returned: bool = False
                     ) -> RetainedSession:
        """Retain the cached ones of ``block_ids`` (a session's table, in order) for
        ``ttl_s`` seconds; a session parked already is re-parked with these blocks. The cap
        then holds (possibly by giving this very session up)."""
        self.release_session(session_id)
        now = self.clock()
        session = RetainedSession(session_id, [], parked_at=now, expected_s=expected_s,
                                  deadline=now + ttl_s, returned=returned)
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.block_hash is None:
                break  # the table's cached prefix ends here
            session.block_ids.append(block_id)
            block.sessions.add(session_id)
            if block.ref_cnt == 0 and self._free_cached.pop(block_id, None) is not None:
                self._free_retained[block_id] = block
        self.retention.sessions[session_id] = session
        self.retention.num_parked += 1
        self._enforce_cap()
        return session

    def release_session(self, session_id: str) -> bool:
        """Stop retaining a session's blocks (it came back, ended or is given up): its free
        blocks join the front of the LRU list, tail block first. False when not parked."""
        session = self.retention.sessions.pop(session_id, None)
        if session is None:
            return False
        for block_id in session.block_ids:
            block = self.blocks[block_id]
            block.sessions.discard(session_id)
            if not block.sessions and self._free_retained.pop(block_id, None) is not None:
                self._free_cached[block_id] = block
                self._free_cached.move_to_end(block_id, last=False)
        return True

    def expire_sessions(self) -> list[str]:
        """Release every session past its deadline; returns their ids."""
        due = self.retention.expired(self.clock())
        for session_id in due:
            self.release_session(session_id)
        self.retention.num_expired += len(due)
        return due

    def _exclusive_retained(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for block in self._free_retained.values():
            if len(block.sessions) == 1:
                (sid,) = block.sessions
                counts[sid] = counts.get(sid, 0) + 1
        return counts

    def _give_up_one(self) -> None:
        victim = self.retention.victim(self.clock(), self._block_size_hint(),
                                       self._exclusive_retained())
        if victim is None:
            raise RuntimeError("retained blocks without a parked session")
        self.release_session(victim)
        self.retention.num_given_up += 1

    def _enforce_cap(self) -> None:
        while len(self._free_retained) > self.retention_cap_blocks:
            self._give_up_one()

    def _block_size_hint(self) -> int:
        """Tokens per block for the benefit estimate (any block's token count; equal)."""
        for block in self._free_retained.values():
            return max(1, len(block.token_ids))
        return 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only possible when no request holds a block."""
        if self.num_used_blocks:
            return False
        for session_id in list(self.retention.sessions):
            self.release_session(session_id)
        for block in list(self._free_cached.values()):
            self._evict(block)
            self._free_uncached[block.block_id] = block
        self._free_cached.clear()
        return True

    def _take_relocated(self, block_id: int) -> KVBlock | None:
        """Free cached block ``block_id`` with its prefix moved to the first uncached free
        block (which joins the cached list's most-recent end); None when it is not free and
        cached, nothing is uncached, no copy function was given, or the copy failed."""
        block = self._free_cached.get(block_id)
        if block is None or self._relocate is None or not self._free_uncached:
            return None
        target_id, target = next(iter(self._free_uncached.items()))
        try:
            self._relocate(block_id, target_id)
        except Exception:  # noqa: BLE001 - only an optimisation: allocate as usual instead
            logger.warning("moving cached KV block %d to %d failed; allocating elsewhere",
                           block_id, target_id, exc_info=True)
            return None
        del self._free_uncached[target_id]
        del self._free_cached[block_id]
        assert block.block_hash is not None
        target.block_hash, target.parent_hash = block.block_hash, block.parent_hash
        target.token_ids = block.token_ids
        self._hash_to_block[block.block_hash] = target
        self._free_cached[target_id] = target
        block._clear_hash()
        self.num_relocations += 1
        return block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._hash_to_block[block.block_hash]
            block._clear_hash()
            self.num_evictions += 1
