"""White-box tests of the KV-cache manager: block tables, prefix hits, caching and freeing."""

from __future__ import annotations

import pytest

from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.request import Request
from langchain_ascend.engine.core.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=8))


def admit(kv: KVCacheManager, req: Request) -> int:
    """Admit like the scheduler does (whole prompt in one step); returns hit tokens."""
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits) is not None
    req.num_computed_tokens = num_hit
    return num_hit


def compute_all(kv: KVCacheManager, req: Request) -> None:
    """Pretend the step ran: every known token is now in the cache."""
    req.num_computed_tokens = req.num_tokens
    kv.cache_blocks(req)


def test_allocation_covers_prompt_in_whole_blocks():
    kv = KVCacheManager(8, BS)
    req = make_request("a", list(range(10)))
    assert admit(kv, req) == 0
    assert kv.block_ids("a") == [0, 1, 2]
    assert [b.ref_cnt for b in kv.req_to_blocks["a"]] == [1, 1, 1]
    assert kv.pool.num_free_blocks == 5


def test_decode_allocates_a_block_only_when_crossing_a_boundary():
    kv = KVCacheManager(8, BS)
    req = make_request("a", list(range(7)))
    admit(kv, req)
    compute_all(kv, req)
    assert kv.block_ids("a") == [0, 1]
    req.append_output_token(100)  # token 8 fits in block 1
    assert kv.allocate_slots(req, 1) == []
    compute_all(kv, req)
    req.append_output_token(101)  # token 9 needs a third block
    new = kv.allocate_slots(req, 1)
    assert [b.block_id for b in new] == [2]
    assert kv.block_ids("a") == [0, 1, 2]


def test_only_full_computed_blocks_are_cached():
    kv = KVCacheManager(8, BS)
    req = make_request("a", list(range(10)))
    admit(kv, req)
    req.num_computed_tokens = 6  # a chunk: block 0 full, block 1 half
    kv.cache_blocks(req)
    assert kv.pool.num_cached_blocks == 1
    compute_all(kv, req)
    assert kv.pool.num_cached_blocks == 2  # block 2 holds only 2 tokens
    assert [b.block_hash is not None for b in kv.req_to_blocks["a"]] == [True, True, False]


def test_shared_prefix_hits_and_ref_count_two():
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(10)))
    admit(kv, a)
    compute_all(kv, a)
    b = make_request("b", list(range(8)) + [50, 51, 52])
    assert admit(kv, b) == 8
    assert kv.block_ids("b")[:2] == kv.block_ids("a")[:2] == [0, 1]
    assert kv.block_ids("b")[2:] == [3]
    assert [blk.ref_cnt for blk in kv.req_to_blocks["a"]] == [2, 2, 1]


def test_hit_is_capped_so_last_token_is_recomputed():
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    assert kv.pool.num_cached_blocks == 2
    same = make_request("same", list(range(8)))
    hits, num_hit = kv.get_computed_blocks(same)
    assert num_hit == 4 and [b.block_id for b in hits] == [0]
    longer = make_request("longer", list(range(9)))
    assert kv.get_computed_blocks(longer)[1] == 8


def test_hit_stops_at_first_mismatching_block():
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(12)))
    admit(kv, a)
    compute_all(kv, a)
    b = make_request("b", [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12])
    assert kv.get_computed_blocks(b)[1] == 4  # block 2 matches by tokens but not by prefix


def test_generated_tokens_are_cached_for_the_next_hop():
    kv = KVCacheManager(10, BS)
    a = make_request("a", [1, 2, 3, 4, 5, 6])
    admit(kv, a)
    compute_all(kv, a)
    for tok in (7, 8, 9):
        a.append_output_token(tok)
        kv.allocate_slots(a, 1)
        compute_all(kv, a)
    # 9 computed tokens: blocks [1..4] [5..8] are full and cached
    assert kv.pool.num_cached_blocks == 2
    kv.free(a)
    hop2 = make_request("hop2", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert admit(kv, hop2) == 8


def test_free_releases_tail_first_so_prefix_survives_longest():
    kv = KVCacheManager(6, BS)
    a = make_request("a", list(range(12)))
    admit(kv, a)
    compute_all(kv, a)
    assert kv.block_ids("a") == [0, 1, 2]
    kv.free(a)
    assert kv.block_ids("a") == []
    # plain never-used blocks first, then cached blocks tail-first
    assert kv.pool.eviction_order() == [3, 4, 5, 2, 1, 0]


def test_touched_hit_block_leaves_free_list_and_is_not_evicted():
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    kv.free(a)
    assert kv.pool.eviction_order() == [2, 3, 1, 0]
    b = make_request("b", list(range(4)) + [70, 71, 72, 73, 74, 75, 76])
    assert admit(kv, b) == 4
    # b reuses block 0 and takes 2 more: plain 2, 3 go first, block 1 is not needed
    assert kv.block_ids("b") == [0, 2, 3]
    assert kv.pool.eviction_order() == [1]


def test_eviction_drops_hash_so_later_request_misses():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    kv.free(a)
    big = make_request("big", [90 + i for i in range(12)])
    assert admit(kv, big) == 0  # uses all 3 blocks, evicting both cached ones
    assert kv.pool.num_cached_blocks == 0
    kv.free(big)
    again = make_request("again", list(range(8)))
    assert kv.get_computed_blocks(again) == ([], 0)


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    kv.free(a)
    b = make_request("b", list(range(4)) + list(range(100, 120)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 4
    assert kv.allocate_slots(b, b.num_tokens - num_hit, hits) is None
    assert kv.block_ids("b") == []
    assert hits[0].ref_cnt == 0
    assert kv.pool.eviction_order() == [2, 3, 1, 0]


def test_hit_blocks_sitting_on_free_list_count_against_free_space():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    kv.free(a)
    # 2 cached free blocks + 1 plain; b hits 1 block and needs 2 more (3 total): fits
    b = make_request("b", list(range(4)) + [40, 41, 42, 43, 44])
    hits, _ = kv.get_computed_blocks(b)
    assert kv.num_blocks_needed(b, b.num_tokens - 4, hits) == 3
    assert kv.allocate_slots(b, b.num_tokens - 4, hits) is not None
    assert kv.pool.num_free_blocks == 0


def test_weak_hash_collision_is_never_a_hit():
    kv = KVCacheManager(8, BS, hash_fn=lambda parent, tokens: b"collide")
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(kv, a)
    compute_all(kv, a)
    b = make_request("b", [9, 9, 9, 9, 5])
    assert kv.get_computed_blocks(b) == ([], 0)
    same = make_request("same", [1, 2, 3, 4, 5])
    assert kv.get_computed_blocks(same)[1] == 4


def test_prefix_caching_disabled():
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    compute_all(kv, a)
    assert kv.pool.num_cached_blocks == 0
    b = make_request("b", list(range(9)))
    assert admit(kv, b) == 0
    kv.record_prefix_lookup(9, 0)
    assert kv.num_queried_tokens == 0


def test_hits_only_at_admission():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    compute_all(kv, a)
    b = make_request("b", list(range(9)))
    admit(kv, b)
    hits, _ = kv.get_computed_blocks(b)
    with pytest.raises(RuntimeError):
        kv.allocate_slots(b, 1, hits)


def test_readmission_after_free_hits_own_blocks():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(6)))
    admit(kv, a)
    compute_all(kv, a)
    a.append_output_token(6)
    a.append_output_token(7)  # two generated tokens, only the first computed
    kv.allocate_slots(a, 1)
    a.num_computed_tokens = 7
    kv.cache_blocks(a)
    kv.free(a)  # preempted
    a.num_computed_tokens = 0
    hits, num_hit = kv.get_computed_blocks(a)
    assert num_hit == 4 and [b.block_id for b in hits] == [0]
