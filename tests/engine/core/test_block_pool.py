"""White-box tests of the block pool: exact block ids, reference counts and eviction order."""

from __future__ import annotations

import pytest

from langchain_ascend.engine.core.block_pool import BlockPool, OutOfBlocksError, hash_block_tokens


def cache(pool: BlockPool, block, tokens, parent=None):
    h = hash_block_tokens(parent, tokens)
    assert pool.cache_block(block, h, parent, tokens)
    return h


def test_fresh_pool_hands_out_blocks_in_id_order():
    pool = BlockPool(5)
    assert pool.eviction_order() == [0, 1, 2, 3, 4]
    blocks = pool.allocate(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    assert pool.num_free_blocks == 2
    assert pool.num_used_blocks == 3


def test_allocate_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(3)
    pool.allocate(2)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.eviction_order() == [2]


def test_freed_plain_blocks_join_tail_in_given_order():
    pool = BlockPool(4)
    a, b, c = pool.allocate(3)
    pool.free([c, a])
    assert pool.eviction_order() == [3, 2, 0]
    assert (a.ref_cnt, b.ref_cnt, c.ref_cnt) == (0, 1, 0)


def test_allocation_after_a_block_prefers_the_next_uncached_one():
    pool = BlockPool(8)
    a, b, c, d = pool.allocate(4)
    pool.free([b, d])  # uncached order: 4, 5, 6, 7, 1, 3
    assert pool.eviction_order() == [4, 5, 6, 7, 1, 3]
    assert [x.block_id for x in pool.allocate(2, after=a.block_id)] == [1, 4]  # 2 is taken
    assert [x.block_id for x in pool.allocate(1, after=c.block_id)] == [3]
    assert [x.block_id for x in pool.allocate(1)] == [5]  # no hint: the usual order
    assert pool.eviction_order() == [6, 7]


def test_allocation_after_a_block_never_takes_a_cached_block_early():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    cache(pool, b, [1, 2])
    pool.free([c, b])  # 2 uncached, 1 cached
    assert [x.block_id for x in pool.allocate(1, after=a.block_id)] == [2]
    assert pool.num_cached_blocks == 1 and pool.eviction_order() == [1]


def test_a_cached_block_in_the_way_is_relocated_not_evicted():
    copies: list[tuple[int, int]] = []
    pool = BlockPool(6, relocate=lambda src, dst: copies.append((src, dst)))
    a, b, c, d = pool.allocate(4)
    hb = cache(pool, b, [1, 2])
    hc = cache(pool, c, [3, 4], hb)
    pool.free([d, c, b])  # uncached: 4, 5, 3; cached LRU: 2, 1
    assert pool.eviction_order() == [4, 5, 3, 2, 1]
    taken = pool.allocate(2, after=a.block_id)
    assert [x.block_id for x in taken] == [1, 2]  # consecutive after block 0
    assert copies == [(1, 4), (2, 5)]  # each prefix moved to the first uncached block
    assert pool.num_relocations == 2 and pool.num_evictions == 0
    moved_b, moved_c = pool.lookup(hb, None, [1, 2]), pool.lookup(hc, hb, [3, 4])
    assert (moved_b.block_id, moved_c.block_id) == (4, 5)
    assert moved_b.ref_cnt == 0 and all(x.block_hash is None for x in taken)
    assert pool.eviction_order() == [3, 4, 5]  # moved blocks join the cached list's end
    assert pool.num_cached_blocks == 2


def test_no_relocation_without_an_uncached_block_or_when_the_copy_fails():
    def failing(src: int, dst: int) -> None:
        raise RuntimeError("device busy")

    pool = BlockPool(4, relocate=failing)
    a, b, c, d = pool.allocate(4)
    hb = cache(pool, b, [1, 2])
    pool.free([b, d])  # uncached: 3; cached: 1
    # The copy fails: the cached block stays where it is, the usual order applies.
    assert [x.block_id for x in pool.allocate(1, after=a.block_id)] == [3]
    assert pool.lookup(hb, None, [1, 2]).block_id == 1 and pool.num_relocations == 0
    pool2 = BlockPool(2, relocate=lambda src, dst: None)
    a2, b2 = pool2.allocate(2)
    cache(pool2, b2, [5, 6])
    pool2.free([b2])  # only a cached block is free: nothing to move it to, so it is evicted
    assert [x.block_id for x in pool2.allocate(1, after=a2.block_id)] == [1]
    assert pool2.num_relocations == 0 and pool2.num_evictions == 1


def test_double_free_is_detected():
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.free([a])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([a])


def test_cached_free_blocks_are_evicted_after_plain_ones_in_lru_order():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    h0 = cache(pool, blocks[0], [1, 2])
    cache(pool, blocks[1], [3, 4], h0)
    # free order: block 1 (tail) first, then block 0, then the plain blocks 3 and 2
    pool.free([blocks[1], blocks[0], blocks[3], blocks[2]])
    assert pool.eviction_order() == [3, 2, 1, 0]
    assert pool.num_cached_blocks == 2
    first = pool.allocate(3)
    assert [b.block_id for b in first] == [3, 2, 1]
    # block 1 was evicted: its hash mapping is gone, block 0 still cached
    assert first[2].block_hash is None and first[2].token_ids == ()
    assert pool.num_cached_blocks == 1
    assert pool.num_evictions == 1
    assert pool.lookup(h0, None, [1, 2]) is blocks[0]


def test_touch_takes_cached_block_off_free_list_and_counts_refs():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    h = cache(pool, a, [7, 7])
    pool.free([a, b, c])
    assert pool.eviction_order() == [1, 2, 0]
    hit = pool.lookup(h, None, [7, 7])
    assert hit is a
    pool.touch([hit])
    assert a.ref_cnt == 1
    assert pool.eviction_order() == [1, 2]
    pool.touch([hit])
    assert a.ref_cnt == 2
    pool.free([a])
    assert a.ref_cnt == 1 and pool.eviction_order() == [1, 2]
    pool.free([a])
    assert pool.eviction_order() == [1, 2, 0]
    # still cached after being freed again
    assert pool.lookup(h, None, [7, 7]) is a


def test_refreed_cached_block_moves_to_most_recent_end():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    hashes = [cache(pool, blk, [i, i]) for i, blk in enumerate(blocks)]
    pool.free(blocks)
    assert pool.eviction_order() == [0, 1, 2]
    pool.touch([blocks[0]])
    pool.free([blocks[0]])
    assert pool.eviction_order() == [1, 2, 0]
    (evicted,) = pool.allocate(1)
    assert evicted.block_id == 1
    assert pool.lookup(hashes[1], None, [1, 1]) is None
    assert pool.lookup(hashes[0], None, [0, 0]) is blocks[0]


def test_lookup_verifies_tokens_and_parent_not_just_hash():
    pool = BlockPool(2)
    a, _ = pool.allocate(2)
    colliding = b"same-hash"
    assert pool.cache_block(a, colliding, None, [1, 2, 3])
    assert pool.lookup(colliding, None, [1, 2, 3]) is a
    assert pool.lookup(colliding, None, [1, 2, 4]) is None
    assert pool.lookup(colliding, b"other-parent", [1, 2, 3]) is None


def test_second_block_with_same_hash_stays_plain():
    pool = BlockPool(3)
    a, b, _ = pool.allocate(3)
    h = cache(pool, a, [5, 6])
    assert not pool.cache_block(b, h, None, [5, 6])
    assert b.block_hash is None
    assert not pool.cache_block(a, h, None, [5, 6])  # already cached
    pool.free([b])
    assert pool.eviction_order() == [1]
    assert pool.num_cached_blocks == 1


def test_cannot_cache_a_free_block():
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.free([a])
    with pytest.raises(RuntimeError):
        pool.cache_block(a, b"h", None, [1])


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    cache(pool, a, [1])
    pool.free([a, b])
    assert not pool.reset_prefix_cache()
    pool.free([c])
    assert pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0
    assert a.block_hash is None
    assert pool.num_free_blocks == 3


def test_hash_chain_depends_on_parent_and_tokens():
    h1 = hash_block_tokens(None, [1, 2])
    assert h1 == hash_block_tokens(None, [1, 2])
    assert h1 != hash_block_tokens(None, [2, 1])
    assert hash_block_tokens(h1, [3, 4]) != hash_block_tokens(None, [3, 4])
    assert hash_block_tokens(None, [1 << 40]) != hash_block_tokens(None, [0])
