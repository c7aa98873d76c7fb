"""White-box tests of the scheduler: budget, chunking, admission, preemption, stops, aborts."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from langchain_ascend.engine.core.batch import ScheduledBatch
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.scheduler import Scheduler

BS = 4
EOS = 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(num_blocks=16, budget=64, batch=8, max_model_len=None, caching=True,
                   clock=None, prefill_beside_decodes=None, prefill_cost_context=None,
                   policy="fcfs"):
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(kv, max_num_batched_tokens=budget, max_batch_size=batch,
                     max_model_len=max_model_len or num_blocks * BS,
                     clock=clock or FakeClock(), prefill_beside_decodes=prefill_beside_decodes,
                     prefill_cost_context=prefill_cost_context, policy=policy)


def add(sched: Scheduler, rid: str, prompt, session_id=None, **params) -> Request:
    params.setdefault("max_tokens", 100)
    req = Request(rid, prompt, SamplingParams(**params), eos_token_ids=[EOS],
                  session_id=session_id)
    sched.add_request(req)
    return req


def step(sched: Scheduler, token=7) -> ScheduledBatch:
    """Schedule, 'run' (every sampling segment yields ``token``) and update."""
    batch = sched.schedule()
    sampled = [token if s.sample else None for s in batch.segments]
    sched.update(batch, sampled)
    return batch


def test_prefill_then_decode_segments():
    sched = make_scheduler()
    req = add(sched, "a", [10, 11, 12, 13, 14])
    batch = sched.schedule()
    (seg,) = batch.segments
    assert (seg.request_id, seg.token_ids, seg.start_pos, seg.block_ids, seg.sample) == (
        "a", [10, 11, 12, 13, 14], 0, [0, 1], True)
    sched.update(batch, [20])
    assert req.output_token_ids == [20] and req.num_computed_tokens == 5
    batch = sched.schedule()
    (seg,) = batch.segments
    assert (seg.token_ids, seg.start_pos, seg.block_ids, seg.sample, seg.is_decode) == (
        [20], 5, [0, 1], True, True)
    sched.update(batch, [21])
    sched.update(sched.schedule(), [22])
    sched.update(sched.schedule(), [23])  # wrote position 7: block 1 is now full
    batch = sched.schedule()  # position 8 crosses into a third block
    assert batch.segments[0].start_pos == 8
    assert batch.segments[0].block_ids == [0, 1, 2]


def test_chunked_prefill_by_token_budget():
    sched = make_scheduler(budget=6)
    req = add(sched, "a", list(range(100, 114)))
    chunks = []
    for _ in range(3):
        batch = step(sched)
        (seg,) = batch.segments
        chunks.append((seg.start_pos, len(seg.token_ids), seg.sample, len(seg.block_ids)))
    assert chunks == [(0, 6, False, 2), (6, 6, False, 3), (12, 2, True, 4)]
    assert req.output_token_ids == [7]
    assert req.num_computed_tokens == 14


def test_decodes_go_first_and_share_budget_with_new_prefill():
    sched = make_scheduler(budget=5)
    add(sched, "a", [1, 3, 4])
    step(sched)
    add(sched, "b", list(range(20, 30)))
    batch = step(sched)
    assert [(s.request_id, s.num_tokens) for s in batch.segments] == [("a", 1), ("b", 4)]
    batch = step(sched)
    # a decodes, b is mid-prefill: decode first, then b's next chunk
    assert [(s.request_id, s.num_tokens, s.sample) for s in batch.segments] == [
        ("a", 1, True), ("b", 4, False)]


def test_a_step_with_decodes_takes_at_most_its_prefill_share():
    sched = make_scheduler(num_blocks=32, budget=16, prefill_beside_decodes=5)
    alone = add(sched, "a", list(range(100, 116)))  # 16 tokens, nobody decodes: one step
    assert [(s.request_id, s.num_tokens) for s in step(sched).segments] == [("a", 16)]
    add(sched, "b", list(range(20, 27)))  # 7 tokens
    add(sched, "c", list(range(40, 43)))  # 3 tokens
    chunks = [[(s.request_id, s.num_tokens) for s in step(sched).segments] for _ in range(3)]
    # a decodes in every step; b and c share 5 prefill tokens a step, running ones first
    assert chunks == [[("a", 1), ("b", 5)], [("a", 1), ("b", 2), ("c", 3)],
                      [("a", 1), ("b", 1), ("c", 1)]]
    assert alone.num_output_tokens == 4
    with pytest.raises(ValueError, match="prefill_beside_decodes"):
        make_scheduler(prefill_beside_decodes=0)


@pytest.mark.parametrize("cost_context,chunks", [
    (None, [8, 8, 8, 8]),
    # a token from position p weighs 1 + p / 8: the share of 8 buys fewer tokens further in
    (8, [8, 4, 3, 2]),
])
def test_prefill_beside_decodes_is_charged_by_its_attention(cost_context, chunks):
    sched = make_scheduler(num_blocks=32, budget=64, prefill_beside_decodes=8,
                           prefill_cost_context=cost_context)
    add(sched, "a", [1, 3, 4])
    step(sched)  # a decodes from now on
    add(sched, "b", list(range(20, 60)))
    taken = [[s.num_tokens for s in step(sched).segments if s.request_id == "b"]
             for _ in range(4)]
    assert taken == [[n] for n in chunks]
    alone = make_scheduler(num_blocks=32, budget=64, prefill_cost_context=8)
    add(alone, "b", list(range(20, 60)))  # nobody decodes: the whole budget, by tokens
    assert [s.num_tokens for s in step(alone).segments] == [40]
    with pytest.raises(ValueError, match="prefill_cost_context"):
        make_scheduler(prefill_cost_context=0)
    with pytest.raises(ValueError, match="prefill_cost_context"):
        make_scheduler(prefill_cost_context=float("nan"))


def test_agent_policy_admits_the_older_agents_hop_first():
    """Agents at one service level run in the order they started, not in lockstep: the older
    agent's next hop is admitted before a younger agent's that waits ahead of it."""
    for policy, first in (("agent", "old-1"), ("fcfs", "young-1")):
        sched = make_scheduler(num_blocks=64, budget=4, policy=policy)
        add(sched, "old-0", [1, 2], max_tokens=1, session_id="old")
        step(sched)  # old's first hop: done, old is the older agent
        add(sched, "young-1", [7, 8, 9, 10], session_id="young")
        add(sched, "old-1", [1, 2, 5, 6], session_id="old")
        assert sched.attained_service["old"] < 256  # one service level (agent_policy)
        assert [s.request_id for s in step(sched).segments] == [first], policy


def test_agent_policy_gives_the_prefill_share_to_the_older_agent_first():
    """A younger agent's hop that started its prefill first does not keep the share beside
    decodes from an older agent's hop admitted after it."""
    chunks = {}
    for policy in ("agent", "fcfs"):
        sched = make_scheduler(num_blocks=64, budget=64, prefill_beside_decodes=4,
                               prefill_cost_context=1000, policy=policy)
        add(sched, "old-0", [1, 2], max_tokens=1, session_id="old")
        step(sched)  # old is the older agent
        add(sched, "d", [1, 3, 4])
        step(sched)  # d decodes from now on
        add(sched, "young-1", list(range(20, 40)), session_id="young")
        step(sched)  # young-1's first chunk
        add(sched, "old-1", list(range(60, 80)), session_id="old")
        step(sched)  # young-1's second chunk; old-1 admitted with what is left (1 token)
        assert {r.request_id for r in sched.running} == {"d", "young-1", "old-1"}
        chunks[policy] = [(s.request_id, s.num_tokens) for s in step(sched).segments
                          if s.request_id != "d"]
    assert chunks["agent"][0] == ("old-1", 3) and chunks["fcfs"][0][0] == "young-1"


def test_max_batch_size_limits_admission():
    sched = make_scheduler(batch=2)
    for rid in "abc":
        add(sched, rid, [5, 6, 7])
    batch = step(sched)
    assert [s.request_id for s in batch.segments] == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]


def test_head_of_queue_that_does_not_fit_blocks_later_ones():
    sched = make_scheduler(num_blocks=4)
    add(sched, "a", list(range(10, 19)))  # 9 tokens: 3 blocks
    step(sched)
    add(sched, "big", list(range(30, 38)))  # needs 2 blocks, 1 free
    add(sched, "small", [40])  # would fit, but must not jump the queue
    batch = step(sched)
    assert [s.request_id for s in batch.segments] == ["a"]
    assert [r.request_id for r in sched.waiting] == ["big", "small"]
    assert sched.num_preemptions == 0


def test_preemption_takes_newest_running_first_and_keeps_generated_tokens():
    sched = make_scheduler(num_blocks=4)
    a = add(sched, "a", [10, 11, 12])
    add(sched, "b", [20, 21, 22])
    c = add(sched, "c", [30, 31, 32])
    step(sched, token=50)
    assert [sched.kv.block_ids(r) for r in "abc"] == [[0], [1], [2]]
    # every request now has 4 tokens; the next decode writes position 3 (still block 0)
    step(sched, token=51)
    assert a.output_token_ids == [50, 51]
    # all need a second block: a takes the last free one, b gets it by preempting the newest
    batch = sched.schedule()
    assert batch.preempted_ids == ["c"]
    assert [s.request_id for s in batch.segments] == ["a", "b"]
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert c.output_token_ids == [50, 51]
    assert sched.kv.block_ids("c") == []
    assert sched.kv.block_ids("a") == [0, 3]
    assert sched.kv.block_ids("b") == [1, 2]
    assert [r.request_id for r in sched.waiting] == ["c"]
    assert sched.num_preemptions == 1 and c.num_preemptions == 1


def test_preempted_request_is_resumed_from_its_own_cached_blocks():
    sched = make_scheduler(num_blocks=5)
    a = add(sched, "a", [10, 11, 12], max_tokens=3)
    add(sched, "b", [20, 21, 22], max_tokens=3)
    c = add(sched, "c", [30, 31, 32, 33, 34], max_tokens=3)
    step(sched, 50)
    step(sched, 51)
    assert sched.kv.block_ids("c") == [2, 3]
    batch = sched.schedule()  # a takes block 4; b preempts c and gets c's partial block 3
    assert batch.preempted_ids == ["c"]
    assert sched.kv.block_ids("b") == [1, 3]
    sched.update(batch, [52, 52])
    assert a.status is RequestStatus.FINISHED_LENGTH
    batch = sched.schedule()
    (seg,) = batch.segments
    # c's full block [30..33] stayed cached: only the rest is recomputed
    assert (seg.request_id, seg.start_pos, seg.token_ids, seg.sample) == (
        "c", 4, [34, 50, 51], True)
    assert seg.block_ids[0] == 2
    assert c.num_cached_tokens == 0  # the stat describes the first scheduling only
    sched.update(batch, [53])
    assert c.status is RequestStatus.FINISHED_LENGTH
    assert c.output_token_ids == [50, 51, 53]


def test_preemption_recompute_without_prefix_cache_replays_all_tokens():
    sched = make_scheduler(num_blocks=4, caching=False)
    add(sched, "a", [10, 11, 12], max_tokens=3)
    add(sched, "b", [20, 21, 22], max_tokens=3)
    add(sched, "c", [30, 31, 32], max_tokens=3)
    step(sched, 50)
    step(sched, 51)
    step(sched, 52)
    (seg,) = sched.schedule().segments
    assert (seg.request_id, seg.start_pos, seg.token_ids) == ("c", 0, [30, 31, 32, 50, 51])


def test_request_preempts_itself_when_older_ones_hold_the_pool():
    sched = make_scheduler(num_blocks=3)
    add(sched, "a", [10, 11, 12, 13, 14])  # 2 blocks
    b = add(sched, "b", [20, 21, 22])  # 1 block
    step(sched)
    step(sched)  # a: 7 tokens, b: 5 tokens; b's next decode needs a second block
    batch = step(sched)
    assert [s.request_id for s in batch.segments] == ["a"]
    # b is the newest and the one in need: it preempts itself, a keeps running
    assert batch.preempted_ids == ["b"]
    assert b.status is RequestStatus.PREEMPTED
    assert sched.kv.block_ids("a") == [0, 1]
    # b's cached first block is free but b needs two: it stays waiting
    batch = step(sched)  # a writes position 7
    assert [s.request_id for s in batch.segments] == ["a"]
    batch = sched.schedule()  # a writes position 8: needs a third block, evicts b's block
    assert [s.request_id for s in batch.segments] == ["a"]
    assert sched.kv.block_ids("a") == [0, 1, 2]
    assert batch.preempted_ids == [] and b.status is RequestStatus.PREEMPTED


def test_no_admission_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=4)
    add(sched, "a", [10, 11, 12])
    add(sched, "b", [20, 21, 22])
    add(sched, "c", [30, 31, 32])
    step(sched)
    step(sched)
    add(sched, "d", [1])
    batch = sched.schedule()
    assert batch.preempted_ids == ["c"]
    assert "d" not in [s.request_id for s in batch.segments]
    assert [r.request_id for r in sched.waiting] == ["c", "d"]


def test_abort_frees_blocks_at_once_and_reports_finished_id():
    sched = make_scheduler(num_blocks=8)
    add(sched, "a", list(range(10, 19)))
    add(sched, "b", [1, 3])
    step(sched)
    assert sched.kv.pool.num_free_blocks == 4
    req = sched.abort_request("a")
    assert req.status is RequestStatus.FINISHED_ABORTED
    assert sched.kv.pool.num_free_blocks == 7
    assert sched.abort_request("a") is None
    batch = sched.schedule()
    assert batch.finished_ids == ["a"]
    assert [s.request_id for s in batch.segments] == ["b"]
    assert sched.schedule().finished_ids == []


def test_abort_of_waiting_request():
    sched = make_scheduler()
    add(sched, "a", [1, 3])
    sched.abort_request("a")
    assert not sched.has_unfinished_requests()
    assert not sched.schedule()


def test_update_ignores_request_aborted_while_step_ran():
    sched = make_scheduler()
    a = add(sched, "a", [1, 3])
    b = add(sched, "b", [4, 5])
    batch = sched.schedule()
    sched.abort_request("a")
    outputs = sched.update(batch, [7, 8])
    assert [o.request.request_id for o in outputs] == ["b"]
    assert a.output_token_ids == [] and b.output_token_ids == [8]


def test_update_ignores_new_request_reusing_an_aborted_id():
    sched = make_scheduler()
    add(sched, "a", [1, 3])
    batch = sched.schedule()
    sched.abort_request("a")
    again = add(sched, "a", [9, 9, 9])
    assert sched.update(batch, [7]) == []
    assert again.output_token_ids == [] and again.num_computed_tokens == 0


def test_eos_stops_and_is_hidden():
    sched = make_scheduler()
    req = add(sched, "a", [1, 3])
    step(sched, 9)
    batch = sched.schedule()
    outputs = sched.update(batch, [EOS])
    assert outputs[0].finished
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert req.output_token_ids == [9, EOS] and req.returned_token_ids == [9]
    assert req.stop_reason is None
    assert sched.kv.pool.num_free_blocks == 16


def test_ignore_eos_and_stop_token_ids():
    sched = make_scheduler()
    a = add(sched, "a", [1, 3], ignore_eos=True, stop_token_ids=[77])
    step(sched, EOS)
    assert a.status is RequestStatus.RUNNING
    step(sched, 77)
    assert a.status is RequestStatus.FINISHED_STOPPED
    assert a.stop_reason == 77 and a.returned_token_ids == [EOS]


def test_max_tokens_gives_length():
    sched = make_scheduler()
    a = add(sched, "a", [1, 3], max_tokens=2)
    step(sched)
    step(sched)
    assert a.status is RequestStatus.FINISHED_LENGTH
    assert a.returned_token_ids == [7, 7]


def test_max_model_len_caps_a_request_alone_in_the_pool():
    sched = make_scheduler(num_blocks=2)  # capacity 8 tokens
    a = add(sched, "a", [1, 3, 4, 5, 6], max_tokens=100)
    for _ in range(10):
        if not sched.has_unfinished_requests():
            break
        step(sched)
    assert a.status is RequestStatus.FINISHED_LENGTH
    assert a.num_tokens == 8 and len(a.output_token_ids) == 3


def test_constraint_termination_stops_and_keeps_token():
    class DoneAfterOne:
        def mask_logits(self, logits):
            pass

        def accept_token(self, token_id):
            pass

        def is_terminated(self):
            return True

    sched = make_scheduler()
    a = add(sched, "a", [1, 3], constraint=DoneAfterOne())
    step(sched, 9)
    assert a.status is RequestStatus.FINISHED_STOPPED
    assert a.returned_token_ids == [9]


def test_prefix_hit_at_admission_sets_cached_tokens_and_stats():
    sched = make_scheduler()
    add(sched, "a", list(range(10, 20)), max_tokens=1)
    step(sched)
    b = add(sched, "b", list(range(10, 20)) + [5])
    batch = sched.schedule()
    (seg,) = batch.segments
    assert seg.start_pos == 8 and seg.token_ids == [18, 19, 5]
    assert seg.block_ids[:2] == [0, 1]
    assert b.num_cached_tokens == 8
    assert sched.kv.num_queried_tokens == 21 and sched.kv.num_hit_tokens == 8


def test_lookup_of_blocked_head_is_counted_once():
    sched = make_scheduler(num_blocks=3)
    add(sched, "a", list(range(10, 19)))
    add(sched, "b", list(range(30, 38)))
    step(sched)
    step(sched)
    assert sched.kv.num_queried_tokens == 9


def test_timestamps_and_stats():
    clock = FakeClock()
    sched = make_scheduler(clock=clock)
    clock.now = 1.0
    req = Request("a", [1, 3, 4], SamplingParams(max_tokens=2), arrival_time=0.5)
    sched.add_request(req)
    clock.now = 2.0
    step(sched)
    clock.now = 3.5
    step(sched)
    stats = req.stats()
    assert (stats.queue_time, stats.time_to_first_token, stats.decode_time) == (1.5, 1.5, 1.5)
    assert (stats.num_prompt_tokens, stats.num_generated_tokens, stats.num_cached_tokens) == (
        3, 2, 0)


def check_block_accounting(sched: Scheduler) -> None:
    """Every block's ref count equals the live block tables holding it; free = ref 0."""
    holders = Counter(bid for blocks in sched.kv.req_to_blocks.values()
                      for bid in (b.block_id for b in blocks))
    assert set(sched.kv.req_to_blocks) <= {r.request_id for r in sched.running}
    for block in sched.kv.pool.blocks:
        assert block.ref_cnt == holders.get(block.block_id, 0)
    free_ids = sched.kv.pool.eviction_order()
    assert len(free_ids) == len(set(free_ids)) == sched.kv.pool.num_free_blocks
    assert set(free_ids) == {b.block_id for b in sched.kv.pool.blocks if b.ref_cnt == 0}
    for request in sched.running:
        assert len(sched.kv.req_to_blocks[request.request_id]) * BS >= request.num_computed_tokens


def test_many_requests_under_pressure_all_finish_and_pool_is_whole_again():
    sched = make_scheduler(num_blocks=6, budget=7, batch=4)
    reqs = [add(sched, f"r{i}", list(range(i, i + 3 + i % 5)), max_tokens=6 + i % 4)
            for i in range(10)]
    for _ in range(500):
        if not sched.has_unfinished_requests():
            break
        batch = step(sched, 60)
        assert batch.num_tokens <= 7 and len(batch.segments) <= 4
        check_block_accounting(sched)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in reqs)
    assert [len(r.output_token_ids) for r in reqs] == [6 + i % 4 for i in range(10)]
    assert sched.num_preemptions > 0
    assert sched.kv.pool.num_free_blocks == 6
    assert all(b.ref_cnt == 0 for b in sched.kv.pool.blocks)


def test_random_traffic_with_aborts_keeps_accounting_exact():
    rng = random.Random(0)
    sched = make_scheduler(num_blocks=10, budget=9, batch=5)
    shared = [rng.randrange(3, 50) for _ in range(9)]
    for i in range(60):
        if rng.random() < 0.5:
            prompt = shared[: rng.randrange(1, 10)] + [rng.randrange(3, 50)
                                                       for _ in range(rng.randrange(0, 8))]
            add(sched, f"r{i}", prompt, max_tokens=rng.randrange(1, 9))
        if sched.requests and rng.random() < 0.15:
            sched.abort_request(rng.choice(sorted(sched.requests)))
        step(sched, rng.choice([7, 8, EOS]))
        check_block_accounting(sched)
    for _ in range(300):
        if not sched.has_unfinished_requests():
            break
        step(sched, 7)
        check_block_accounting(sched)
    assert not sched.has_unfinished_requests()
    assert sched.kv.pool.num_free_blocks == 10
    assert sched.kv.num_hit_tokens > 0


def test_agent_policy_forgets_idle_agents_past_its_limit(monkeypatch):
    """A server that sees new sessions for ever keeps a bounded table of agents: past the
    limit the oldest idle ones go, down to half; agents with a live request stay."""
    from langchain_ascend.engine.core import agent_policy

    monkeypatch.setattr(agent_policy, "MAX_TRACKED_AGENTS", 8)
    sched = make_scheduler(num_blocks=64, budget=64, policy="agent")
    live = add(sched, "live-0", [1, 2], session_id="s-live")
    for i in range(12):
        add(sched, f"r{i}", [3, 4], max_tokens=1, session_id=f"s{i}")
        step(sched)
    assert len(sched.program_age) <= 8 and "s-live" in sched.program_age
    assert "s0" not in sched.program_age and "s11" in sched.program_age
    assert set(sched.attained_service) <= set(sched.program_age)
    assert not live.is_finished
