"""Sessions retained while their tools run: soft, capped, given up by expected benefit.

Exact block ids and orders over small pools; a fake clock drives TTLs.
"""

from __future__ import annotations

import pytest

from langchain_ascend.engine.core.block_pool import BlockPool
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.retention import (
    DEFAULT_TOOL_LATENCY_S,
    RetainedSession,
    RetentionTable,
    ToolLatencyEstimator,
    parse_retention,
    ttl_for,
)
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.scheduler import Scheduler
from langchain_ascend.errors import InvalidRequestError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cached_pool(num_blocks: int, clock: Clock, cap: float = 1.0) -> BlockPool:
    return BlockPool(num_blocks, retention=RetentionTable(cap), clock=clock)


def take_cached(pool: BlockPool, count: int, tag: int) -> list:
    """Allocate ``count`` blocks and register each under a distinct hash."""
    blocks = pool.allocate(count)
    parent = None
    for i, block in enumerate(blocks):
        digest = bytes([tag, i]) * 16
        pool.cache_block(block, digest, parent, [tag, i])
        parent = digest
    return blocks


def test_latency_estimator_default_then_running_mean():
    est = ToolLatencyEstimator(default_s=1.0, weight=0.5)
    assert est.estimate("search") == 1.0
    est.record("search", 0.4)
    assert est.estimate("search") == pytest.approx(0.4)
    est.record("search", 0.8)
    assert est.estimate("search") == pytest.approx(0.6)
    est.record("fetch", float("nan"))  # ignored
    assert est.expected_wait(["search", "fetch"]) == 1.0  # fetch still at its default
    assert est.expected_wait([]) == 1.0


def test_parse_retention_spellings():
    assert parse_retention(None) is None
    assert parse_retention("in_memory") is None
    assert parse_retention("5m") == 300.0
    assert parse_retention("24h") == 86400.0
    assert parse_retention(30) == 30.0
    for bad in ("forever", "0s", "2d", -1, True):
        with pytest.raises(InvalidRequestError):
            parse_retention(bad)


def test_chance_of_return_falls_after_expected_time():
    session = RetainedSession("a", [], parked_at=0.0, expected_s=1.0, deadline=3.0)
    assert session.chance_of_return(0.5) == 1.0
    assert session.chance_of_return(2.0) == pytest.approx(0.5)
    assert session.chance_of_return(3.0) == 0.0


def test_retained_blocks_are_allocated_after_lru_ones():
    clock = Clock()
    pool = cached_pool(6, clock)
    a = take_cached(pool, 2, tag=1)   # blocks 0, 1: session "a"
    b = take_cached(pool, 2, tag=2)   # blocks 2, 3: plain cache
    pool.free(reversed(a))
    pool.free(reversed(b))
    pool.park_session("a", [0, 1], expected_s=1.0, ttl_s=5.0)
    assert pool.num_retained_blocks == 2
    assert pool.num_free_blocks == 6      # retained blocks still count as free
    assert pool.eviction_order() == [4, 5, 3, 2, 0, 1]
    got = [blk.block_id for blk in pool.allocate(4)]
    assert got == [4, 5, 3, 2]            # uncached, then LRU; "a" untouched
    assert pool.lookup(bytes([1, 0]) * 16, None, [1, 0]) is not None
    # Pressure: the next allocation gives "a" up (tail block first), never blocks.
    assert [blk.block_id for blk in pool.allocate(1)] == [1]
    assert pool.retention.sessions == {}
    assert pool.retention.num_given_up == 1
    assert pool.lookup(bytes([1, 0]) * 16, None, [1, 0]) is pool.blocks[0]  # prefix kept


def test_lowest_expected_benefit_is_given_up_first():
    clock = Clock()
    pool = cached_pool(8, clock)
    long_s = take_cached(pool, 3, tag=1)   # 0, 1, 2
    short = take_cached(pool, 1, tag=2)    # 3
    late = take_cached(pool, 3, tag=3)     # 4, 5, 6
    for blocks in (long_s, short, late):
        pool.free(reversed(blocks))
    pool.park_session("long", [0, 1, 2], expected_s=1.0, ttl_s=10.0)
    pool.park_session("short", [3], expected_s=1.0, ttl_s=10.0)
    pool.park_session("late", [4, 5, 6], expected_s=0.1, ttl_s=2.0)
    clock.now += 1.9   # "late" is overdue: 3 blocks x ~0.05 chance < "short": 1 block x 1
    pool.allocate(2)   # 7, then one retained block
    assert set(pool.retention.sessions) == {"long", "short"}
    pool.allocate(1)   # "late"'s remaining blocks are plain LRU now
    pool.allocate(2)
    assert set(pool.retention.sessions) == {"long"}  # then the smaller benefit


def test_cap_holds_when_parking_and_when_freeing():
    clock = Clock()
    pool = cached_pool(8, clock, cap=0.25)   # 2 blocks
    a = take_cached(pool, 2, tag=1)
    b = take_cached(pool, 2, tag=2)
    pool.free(reversed(a))
    pool.park_session("a", [0, 1], expected_s=1.0, ttl_s=5.0)
    assert pool.num_retained_blocks == 2
    # "b" is still in use: parking it counts nothing yet; freeing it breaks the cap.
    pool.park_session("b", [2, 3], expected_s=1.0, ttl_s=9.0)
    assert pool.num_retained_blocks == 2
    pool.free(reversed(b))
    assert pool.num_retained_blocks <= pool.retention_cap_blocks == 2
    assert list(pool.retention.sessions) == ["b"]  # equal benefit: earliest deadline went


def test_session_frees_at_its_ttl():
    clock = Clock()
    pool = cached_pool(4, clock)
    a = take_cached(pool, 2, tag=1)
    pool.free(reversed(a))
    pool.park_session("a", [0, 1], expected_s=1.0, ttl_s=3.0)
    clock.now += 2.9
    assert pool.expire_sessions() == []
    clock.now += 0.2
    assert pool.expire_sessions() == ["a"]
    assert pool.num_retained_blocks == 0
    assert pool.eviction_order() == [2, 3, 1, 0]


def test_hit_on_retained_block_takes_it_back():
    clock = Clock()
    pool = cached_pool(4, clock)
    a = take_cached(pool, 2, tag=1)
    pool.free(reversed(a))
    pool.park_session("a", [0, 1], expected_s=1.0, ttl_s=3.0)
    pool.touch([pool.blocks[0]])
    assert pool.num_retained_blocks == 1 and pool.blocks[0].ref_cnt == 1
    pool.free([pool.blocks[0]])
    assert pool.num_retained_blocks == 2      # back on the retained list: still parked


def request(rid: str, tokens: list[int], session: str | None = None, **kw) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), session_id=session, **kw)


def test_manager_parks_last_table_and_counts_resume():
    clock = Clock()
    kv = KVCacheManager(16, 4, retention=RetentionTable(1.0), clock=clock)
    first = request("h1", list(range(10)), "s")
    kv.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    kv.cache_blocks(first)
    kv.free(first)
    assert kv.session_tokens("s") == list(range(10))
    ttl = kv.park("s", tool_names=["search"])
    assert ttl == ttl_for(DEFAULT_TOOL_LATENCY_S)
    assert kv.pool.num_retained_blocks == 2          # the 2 full blocks; the partial one is not
    second = request("h2", list(range(10)) + [50, 51, 52], "s")
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 8
    kv.allocate_slots(second, second.num_tokens - num_hit, hits)
    kv.record_session_admission(second, num_hit)
    counters = kv.session_counters
    assert counters.num_resumed == 1 and counters.num_resume_hits == 1
    assert counters.num_recomputed_tokens == 2       # tokens 8, 9 of the partial block
    assert kv.pool.retention.sessions == {}


def test_agent_policy_least_attained_service_and_retained_first():
    clock = Clock()
    kv = KVCacheManager(64, 4, retention=RetentionTable(1.0), clock=clock)
    sched = Scheduler(kv, max_num_batched_tokens=1000, max_batch_size=1, max_model_len=256,
                      clock=clock, policy="agent")
    sched.attained_service.update({"old": 5000, "warm": 300, "cold": 300})
    kv.sessions["warm"] = kv.sessions.get("warm") or type(
        "S", (), {"block_ids": [], "token_ids": []})()
    kv.pool.retention.sessions["warm"] = RetainedSession("warm", [], 100.0, 1.0, 200.0)
    for rid, sid in (("r-old", "old"), ("r-cold", "cold"), ("r-warm", "warm")):
        sched.add_request(request(rid, [1, 2, 3], sid))
    assert sched.schedule().segments[0].request_id == "r-warm"
    fcfs = Scheduler(KVCacheManager(64, 4), max_num_batched_tokens=1000, max_batch_size=1,
                     max_model_len=256)
    for rid, sid in (("r-old", "old"), ("r-cold", "cold")):
        fcfs.add_request(request(rid, [1, 2, 3], sid))
    assert fcfs.schedule().segments[0].request_id == "r-old"


def test_background_prefill_runs_only_in_idle_steps_and_finishes_without_sampling():
    clock = Clock()
    kv = KVCacheManager(64, 4, retention=RetentionTable(1.0), clock=clock)
    sched = Scheduler(kv, max_num_batched_tokens=8, max_batch_size=4, max_model_len=256,
                      clock=clock)
    bg = request("bg", list(range(100, 110)), "s", prefill_only=True)
    fg = request("fg", list(range(10)))
    sched.add_request(bg)
    sched.add_request(fg)
    steps = []
    while not fg.is_finished:  # fg's prefill and its 4 decodes: bg never beside them
        batch = sched.schedule()
        steps.append([seg.request_id for seg in batch.segments])
        sched.update(batch, [7 if seg.sample else None for seg in batch.segments])
    assert all(ids == ["fg"] for ids in steps) and len(steps) == 2 + 3
    batch = sched.schedule()
    assert [seg.request_id for seg in batch.segments] == ["bg"] and not batch.segments[0].sample
    sched.update(batch, [None])
    batch = sched.schedule()
    sched.update(batch, [None])
    assert bg.is_finished and bg.output_token_ids == []
    assert kv.session_counters.num_background_tokens == 10
    assert kv.session_tokens("s") == list(range(100, 110))


def test_a_sessions_next_hop_drops_its_background_prefill():
    clock = Clock()
    kv = KVCacheManager(64, 4, retention=RetentionTable(1.0), clock=clock)
    sched = Scheduler(kv, max_num_batched_tokens=4, max_batch_size=4, max_model_len=256,
                      clock=clock)
    bg = request("bg", list(range(100, 110)), "s", prefill_only=True)
    sched.add_request(bg)
    batch = sched.schedule()
    sched.update(batch, [None])      # 4 of its 10 tokens computed: one full block cached
    hop = request("hop", list(range(100, 112)), "s")
    sched.add_request(hop)
    assert bg.status is RequestStatus.FINISHED_ABORTED and bg not in sched.running
    batch = sched.schedule()
    assert [seg.request_id for seg in batch.segments] == ["hop"]
    assert batch.segments[0].start_pos == 4  # the dropped prefill's block is the hop's hit


def test_a_waiting_request_takes_the_blocks_of_a_paused_background_prefill():
    clock = Clock()
    kv = KVCacheManager(4, 4, retention=RetentionTable(1.0), clock=clock)  # 16 slots
    sched = Scheduler(kv, max_num_batched_tokens=12, max_batch_size=4, max_model_len=16,
                      clock=clock)
    bg = request("bg", list(range(100, 114)), "s", prefill_only=True)
    sched.add_request(bg)
    sched.update(sched.schedule(), [None])  # bg holds 3 of the 4 blocks (12 of 14 computed)
    fg = request("fg", list(range(12)))
    sched.add_request(fg)
    batch = sched.schedule()
    assert [seg.request_id for seg in batch.segments] == ["fg"]
    assert bg.status is RequestStatus.FINISHED_ABORTED and sched.num_preemptions == 1


def test_a_session_whose_next_request_waits_does_not_expire():
    clock = Clock()
    kv = KVCacheManager(16, 4, retention=RetentionTable(1.0), clock=clock)
    sched = Scheduler(kv, max_num_batched_tokens=8, max_batch_size=1, max_model_len=64,
                      clock=clock)
    first = request("h1", list(range(8)), "s")
    kv.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    kv.cache_blocks(first)
    kv.free(first)
    kv.park("s", ttl_s=1.0)
    sched.add_request(request("busy", list(range(50, 58))))   # takes the only batch slot
    sched.add_request(request("h2", list(range(8)) + [9], "s"))
    clock.now += 5.0                                          # long past the TTL
    batch = sched.schedule()
    assert [seg.request_id for seg in batch.segments] == ["busy"]
    assert "s" in kv.pool.retention.sessions                   # returned: kept
    assert kv.pool.retention.sessions["s"].chance_of_return(clock.now) == 1.0
