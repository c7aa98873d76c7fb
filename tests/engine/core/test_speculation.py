"""Prompt lookup, acceptance, the "auto" pause, and the scheduler's draft/rollback bookkeeping
(white box, exact block ids, as for the block pool)."""

from __future__ import annotations

import pytest

from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.scheduler import Scheduler
from langchain_ascend.engine.core.speculation import (
    PromptLookup,
    SpeculationState,
    accept_drafts,
    can_draft,
)
from langchain_ascend.errors import InvalidRequestError

BS = 4
EOS = 2


# ----------------------------------------------------------------- pure functions


def test_accept_drafts_keeps_the_matching_prefix_and_the_models_next_token():
    assert accept_drafts([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted + bonus
    assert accept_drafts([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # second draft rejected
    assert accept_drafts([5, 6, 7], [4, 6, 7, 8]) == [4]  # nothing accepted: plain decode
    assert accept_drafts([], [3]) == [3]
    with pytest.raises(ValueError, match="drafts \\+ 1"):
        accept_drafts([5, 6], [5, 6])


def test_prompt_lookup_proposes_what_followed_the_latest_earlier_match():
    lookup = PromptLookup(min_ngram=2, max_ngram=3)
    tokens = [1, 2, 3, 4, 5, 9, 9, 1, 2]
    assert lookup.propose(tokens, 3) == [3, 4, 5]
    tokens += [3]  # suffix 1 2 3 (a 3-gram) now matches too
    assert lookup.propose(tokens, 2) == [4, 5]
    # the most recent occurrence wins: 7 8 seen twice, followed by 10 then by 11
    lookup = PromptLookup(min_ngram=2, max_ngram=2)
    assert lookup.propose([7, 8, 10, 7, 8, 11, 0, 7, 8], 1) == [11]


def test_prompt_lookup_longest_match_first_and_no_match():
    lookup = PromptLookup(min_ngram=1, max_ngram=3)
    # 1-gram "3" last seen before 6; 3-gram "1 2 3" seen before 4
    tokens = [1, 2, 3, 4, 0, 3, 6, 0, 1, 2, 3]
    assert lookup.propose(tokens, 1) == [4]
    assert PromptLookup(2, 3).propose([1, 2, 3, 4], 4) == []
    assert PromptLookup(2, 3).propose([1, 2, 1, 2], 0) == []


def test_prompt_lookup_is_incremental_and_survives_a_shorter_list():
    lookup = PromptLookup(min_ngram=2, max_ngram=2)
    tokens = [5, 6, 7]
    assert lookup.propose(tokens, 2) == []
    tokens += [8, 5, 6]
    assert lookup.propose(tokens, 2) == [7, 8]
    assert lookup.propose(tokens[:3], 2) == []  # a cut list: index rebuilt, no stale hit
    assert lookup.propose([5, 6, 1, 5, 6], 1) == [1]


def test_prompt_lookup_rejects_bad_sizes():
    with pytest.raises(ValueError):
        PromptLookup(min_ngram=3, max_ngram=2)


def test_auto_pauses_after_failures_and_prompt_lookup_never_does():
    auto = SpeculationState("auto", 4)
    tokens = [1, 2, 3, 1, 2]
    assert auto.propose(tokens, 4) == [3, 1]  # the first draft length
    for _ in range(3):
        auto.record(1, 0)
    paused = [auto.propose(tokens, 4) for _ in range(SpeculationState.AUTO_FIRST_PAUSE)]
    assert paused == [[]] * SpeculationState.AUTO_FIRST_PAUSE
    assert auto.propose(tokens, 4) == [3]  # tries again after the pause, shortened by failures
    always = SpeculationState("prompt_lookup", 4)
    for _ in range(10):
        always.record(2, 0)
    assert always.propose(tokens, 4) == [3]
    assert (always.draft_tokens, always.accepted_tokens, always.num_verify_steps) == (20, 0, 10)


def test_draft_length_doubles_while_accepted_and_halves_on_failure():
    state = SpeculationState("prompt_lookup", 8)
    lengths = []
    for accepted_all in (True, True, True, True, False, False, False, False):
        lengths.append(state.k)
        state.record(state.k, state.k if accepted_all else 0)
    assert lengths == [2, 4, 8, 8, 8, 4, 2, 1]
    assert state.k == 1
    state.record(1, 1)  # recovers once drafts are accepted again
    assert state.k == 2
    tokens = list(range(20)) + list(range(5))
    assert state.propose(tokens, 100) == [5, 6]
    assert state.propose(tokens, 1) == [5]  # the caller's limit wins


class SequenceGrammar:
    """A grammar that accepts one fixed token sequence and then ends (a fake with the
    constraint protocol and ``count_accepted``)."""

    def __init__(self, sequence):
        self.sequence = list(sequence)
        self.position = 0

    def mask_logits(self, logits):
        allowed = self.sequence[self.position]
        keep = float(logits[allowed])
        logits.fill_(float("-inf"))
        logits[allowed] = keep

    def accept_token(self, token_id):
        assert token_id == self.sequence[self.position], (token_id, self.position)
        self.position += 1

    def is_terminated(self):
        return self.position == len(self.sequence)

    def count_accepted(self, tokens):
        ahead = self.sequence[self.position:]
        count = 0
        while count < min(len(tokens), len(ahead)) and tokens[count] == ahead[count]:
            count += 1
        return count


def test_only_greedy_unpenalized_rows_draft():
    assert can_draft(SamplingParams(speculation="auto"))
    assert can_draft(SamplingParams(speculation="auto", constraint=SequenceGrammar([1])))
    assert not can_draft(SamplingParams(speculation="off"))
    assert not can_draft(SamplingParams(speculation="auto", temperature=0.7))
    assert not can_draft(SamplingParams(speculation="auto", repetition_penalty=1.2))
    assert not can_draft(SamplingParams(speculation="auto", num_speculative_tokens=0))


@pytest.mark.parametrize("field,value", [("speculation", "ngram"),
                                         ("num_speculative_tokens", 17),
                                         ("num_speculative_tokens", -1)])
def test_bad_speculation_params_are_typed_errors(field, value):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value}).validate()


# ----------------------------------------------------------------- the scheduler


def make_scheduler(num_blocks=16, budget=64, max_model_len=None):
    kv = KVCacheManager(num_blocks, BS)
    return Scheduler(kv, max_num_batched_tokens=budget, max_batch_size=8,
                     max_model_len=max_model_len or num_blocks * BS, clock=lambda: 0.0)


def add(sched, rid, prompt, *, draft_length=None, **params):
    """A drafting request; ``draft_length`` pins its current draft length (adapts otherwise)."""
    params.setdefault("max_tokens", 100)
    params.setdefault("speculation", "prompt_lookup")
    req = Request(rid, prompt, SamplingParams(**params), eos_token_ids=[EOS])
    if draft_length is not None:
        req.speculation.k = draft_length
    sched.add_request(req)
    return req


def prefill(sched, token):
    batch = sched.schedule()
    sched.update(batch, [token if s.sample else None for s in batch.segments])
    return batch


PROMPT = [10, 11, 12, 13, 14, 15, 16, 10, 11]  # ends in "10 11": drafts 12 13 14 15


def test_a_verify_step_appends_accepted_drafts_and_rolls_back_rejected_slots():
    sched = make_scheduler()
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)
    prefill(sched, 12)  # 9 prompt tokens in blocks 0-2, output [12]
    assert sched.kv.block_ids("a") == [0, 1, 2]
    batch = sched.schedule()
    (seg,) = batch.segments
    # pending token 12, then the drafts after "11 12" earlier in the prompt
    assert seg.draft_token_ids == [13, 14, 15, 16]
    assert (seg.token_ids, seg.start_pos, seg.sample) == ([12, 13, 14, 15, 16], 9, True)
    assert seg.block_ids == [0, 1, 2, 3]  # slots for all 14 positions
    outputs = sched.update(batch, [[13, 99]])  # one draft accepted, then the model's 99
    assert outputs[0].new_token_ids == [13, 99]
    assert req.output_token_ids == [12, 13, 99]
    assert req.num_computed_tokens == 11  # 9 prompt + pending 12 + accepted 13
    # block 3 held only the rejected 15, 16 (positions 12, 13): back in the pool, unhashed
    assert sched.kv.block_ids("a") == [0, 1, 2]
    assert sched.kv.pool.blocks[3].ref_cnt == 0 and sched.kv.pool.blocks[3].block_hash is None
    # only full blocks of verified, computed tokens are hashed (block 2 waits for 99's K/V)
    assert [b.block_hash is not None for b in sched.kv.req_to_blocks["a"]] == [True, True, False]
    assert sched.kv.pool.num_free_blocks == 16 - 3
    assert (sched.num_draft_tokens, sched.num_accepted_tokens) == (4, 1)
    stats = req.stats()
    assert (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_forward_passes) == (4, 1, 2)
    # the next step computes 99 and drafts again from "13 99"? no match: a plain decode
    batch = sched.schedule()
    assert (batch.segments[0].token_ids, batch.segments[0].start_pos) == ([99], 11)


def test_all_drafts_accepted_keeps_the_block_of_the_pending_token():
    sched = make_scheduler()
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)
    prefill(sched, 12)
    batch = sched.schedule()
    sched.update(batch, [[13, 14, 15, 16, 10]])
    assert req.output_token_ids == [12, 13, 14, 15, 16, 10]
    assert req.num_computed_tokens == 14 and sched.kv.block_ids("a") == [0, 1, 2, 3]


def test_a_rejected_draft_never_becomes_a_prefix_hit():
    sched = make_scheduler()
    add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4, max_tokens=5)
    prefill(sched, 12)
    batch = sched.schedule()
    assert batch.segments[0].draft_token_ids == [13, 14, 15]  # max_tokens caps the drafts
    sched.update(batch, [[77]])  # nothing accepted
    # a new request whose prompt continues with the rejected drafts finds only real tokens
    other = Request("b", PROMPT + [12, 13, 14, 15, 16], SamplingParams(max_tokens=1),
                    eos_token_ids=[EOS])
    _, hit_tokens = sched.kv.get_computed_blocks(other)
    assert hit_tokens == 8  # blocks 0-1 only (block 2 holds 10 11 12 77, not 10 11 12 13)


def test_drafts_stop_at_eos_and_max_tokens():
    sched = make_scheduler()
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)
    prefill(sched, 12)
    batch = sched.schedule()
    outputs = sched.update(batch, [[13, EOS]])
    assert outputs[0].finished and req.status is RequestStatus.FINISHED_STOPPED
    assert req.returned_token_ids == [12, 13] and req.last_token_hidden
    assert sched.kv.pool.num_free_blocks == 16  # everything released
    sched2 = make_scheduler()
    req2 = add(sched2, "a", PROMPT, num_speculative_tokens=4, draft_length=4, max_tokens=3)
    prefill(sched2, 12)
    batch = sched2.schedule()
    assert batch.segments[0].draft_token_ids == [13]  # 3 - 1 output - 1 = 1 draft
    sched2.update(batch, [[13, 14]])
    assert req2.status is RequestStatus.FINISHED_LENGTH and req2.output_token_ids == [12, 13, 14]


def test_no_room_for_drafts_means_a_plain_decode_not_a_preemption():
    sched = make_scheduler(num_blocks=4, max_model_len=16)
    add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)  # 3 blocks
    add(sched, "b", [20, 21, 22])  # the 4th block
    first = sched.schedule()
    sched.update(first, [12, 30])
    assert sched.kv.pool.num_free_blocks == 0
    batch = sched.schedule()
    assert not batch.preempted_ids
    assert [(s.request_id, s.draft_token_ids, s.token_ids) for s in batch.segments] == [
        ("a", [], [12]), ("b", [], [30])]


def test_drafts_fit_in_the_step_budget():
    sched = make_scheduler(budget=3)
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)
    while req.num_output_tokens == 0:  # the prompt is prefilled in chunks of 3
        prefill(sched, 12)
    batch = sched.schedule()
    assert batch.segments[0].draft_token_ids == [13, 14]  # 1 pending + 2 drafts = budget
    assert batch.num_tokens == 3


def test_a_verified_result_must_be_a_prefix_of_the_drafts():
    sched = make_scheduler()
    add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4)
    prefill(sched, 12)
    batch = sched.schedule()
    with pytest.raises(ValueError, match="verified prefix"):
        sched.update(batch, [[13, 99, 14]])


def test_auto_drafts_only_where_a_row_is_cheap_enough():
    tokens = [1, 2, 3, 1, 2]
    auto = SpeculationState("auto", 4)
    assert auto.propose(tokens, 4, row_cost=0.9) == []  # every row costs ~ a pass
    assert SpeculationState("prompt_lookup", 4).propose(tokens, 4, row_cost=0.9) == [3, 1]
    assert auto.propose(tokens, 4, row_cost=0.1) == [3, 1]
    # a rate that would be fine when rows are free pauses when each row costs 0.6 of a pass
    pricey = SpeculationState("auto", 4)
    for _ in range(3):
        pricey.record(2, 1, row_cost=0.6)  # 50% accepted < 60% cost
    assert pricey.propose(tokens, 4, row_cost=0.6) == []
    cheap = SpeculationState("auto", 4)
    for _ in range(3):
        cheap.record(2, 1, row_cost=0.1)
    assert cheap.propose(tokens, 4, row_cost=0.1) != []


def test_the_scheduler_passes_the_measured_row_cost_to_auto_requests():
    sched = make_scheduler()
    sched.draft_row_cost = 0.95
    add(sched, "a", PROMPT, speculation="auto", draft_length=4)
    prefill(sched, 12)
    assert sched.schedule().segments[0].draft_token_ids == []


def test_auto_weighs_a_drafted_row_against_the_step_it_joins():
    # a drafted row costing half a pass pays for a lone request at 50% acceptance, but in
    # a step of 8 decode rows it costs 4 / 4.5 of a token: "auto" does not draft there
    alone = make_scheduler(num_blocks=64, budget=128)
    alone.draft_row_cost = 0.5
    assert alone.step_row_cost(1) == 0.5
    assert alone.step_row_cost(8) == pytest.approx(4 / 4.5)
    add(alone, "a", PROMPT, speculation="auto", draft_length=4)
    prefill(alone, 12)
    assert alone.schedule().segments[0].draft_token_ids == [13, 14, 15, 16]
    crowd = make_scheduler(num_blocks=64, budget=128)
    crowd.draft_row_cost = 0.5
    add(crowd, "p0", PROMPT, draft_length=4)
    for i in range(7):
        add(crowd, f"r{i}", PROMPT, speculation="auto", draft_length=4)
    prefill(crowd, 12)
    drafts = {s.request_id: s.draft_token_ids for s in crowd.schedule().segments}
    assert drafts.pop("p0") == [13, 14, 15, 16]  # "prompt_lookup" always drafts
    assert all(d == [] for d in drafts.values()) and len(drafts) == 7


def test_auto_drafting_can_be_turned_off_while_prompt_lookup_still_drafts():
    sched = make_scheduler()
    sched.auto_drafting = False
    add(sched, "a", PROMPT, speculation="auto", draft_length=4)
    add(sched, "b", PROMPT, speculation="prompt_lookup", draft_length=4)
    first = sched.schedule()
    sched.update(first, [12, 12])
    drafts = {s.request_id: s.draft_token_ids for s in sched.schedule().segments}
    assert drafts == {"a": [], "b": [13, 14, 15, 16]}


def test_a_grammar_drops_the_drafts_it_rejects_before_the_pass():
    sched = make_scheduler()
    # the grammar allows 12 then 13 14 99 EOS: of the drafts 13 14 15 16 it keeps 13 14
    grammar = SequenceGrammar([12, 13, 14, 99, EOS])
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4, constraint=grammar)
    prefill(sched, 12)
    grammar.accept_token(12)  # what the sampler does with the sampled token
    batch = sched.schedule()
    assert batch.segments[0].draft_token_ids == [13, 14]
    assert batch.segments[0].token_ids == [12, 13, 14]
    assert grammar.position == 1  # checking the drafts advanced nothing
    for token in (13, 14, 99):  # the sampler's row-by-row verify accepts what it returns
        grammar.accept_token(token)
    outputs = sched.update(batch, [[13, 14, 99]])
    assert outputs[0].new_token_ids == [13, 14, 99] and not outputs[0].finished
    assert req.output_token_ids == [12, 13, 14, 99]


def test_a_grammar_that_ends_at_the_last_verified_token_keeps_every_token():
    sched = make_scheduler()
    grammar = SequenceGrammar([12, 13, 14, 15])  # ends after 15; no EOS involved
    req = add(sched, "a", PROMPT, num_speculative_tokens=4, draft_length=4, constraint=grammar)
    prefill(sched, 12)
    grammar.accept_token(12)
    batch = sched.schedule()
    assert batch.segments[0].draft_token_ids == [13, 14, 15]  # ends the grammar: no more
    for token in (13, 14, 15):
        grammar.accept_token(token)
    outputs = sched.update(batch, [[13, 14, 15]])  # the verify stops where the grammar ends
    assert outputs[0].finished and req.status is RequestStatus.FINISHED_STOPPED
    assert req.output_token_ids == [12, 13, 14, 15]  # none cut because the end was known
