"""Packing a step's segments into pieces: prompts as one multi-token piece, every output
token (sampled, drafted or forced by a grammar) as a one-row decode piece.

The runner test checks what the rule is for: a grammar's forced tokens computed in one pass
give bit for bit the logits of decoding them one at a time, and the pass is one the CPU
decode stack takes.
"""

from __future__ import annotations

import pytest
import torch

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu import weight_layout
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.engine.worker.packing import (
    MAX_OUTPUT_DECODE_ROWS,
    Piece,
    pack,
    pieces_of,
)
from langchain_ascend.testing import needs_native_kernels

GREEDY = SamplingParams(max_tokens=64)


def segment(tokens, start, *, prompt_len, drafts=()):
    prompt = list(range(100, 100 + prompt_len))
    return ScheduledSegment("r", list(tokens) + list(drafts), start, list(range(64)), True,
                            GREEDY, prompt_token_ids=prompt, draft_token_ids=list(drafts))


def test_prompt_chunk_is_one_piece():
    assert pieces_of([segment(range(10), 0, prompt_len=10)], [0]) == [Piece(0, 0, 10)]


def test_forced_outputs_after_a_sampled_token_are_decode_pieces():
    # The sampled token at position 12, then 3 forced ones: 4 output tokens, 4 decode rows.
    got = pieces_of([segment([1, 2, 3, 4], 12, prompt_len=12)], [0])
    assert got == [Piece(0, k, 1) for k in range(4)]


def test_prompt_tail_with_a_forced_prefix_splits_at_the_prompt_end():
    # The last 6 prompt tokens and 3 forced output tokens of a forced call's opening text.
    got = pieces_of([segment(range(9), 4, prompt_len=10)], [0])
    assert got == [Piece(0, 6, 1), Piece(0, 7, 1), Piece(0, 8, 1), Piece(0, 0, 6)]


def test_lone_prompt_token_before_outputs_is_a_decode():
    got = pieces_of([segment(range(3), 9, prompt_len=10)], [0])
    assert got == [Piece(0, 0, 1), Piece(0, 1, 1), Piece(0, 2, 1)]


def test_drafts_stay_decode_pieces_after_forced_outputs():
    got = pieces_of([segment([5, 6], 20, prompt_len=20, drafts=[7, 8])], [0])
    assert got == [Piece(0, k, 1) for k in range(4)]


def test_many_outputs_as_after_a_preemption_stay_one_piece():
    count = MAX_OUTPUT_DECODE_ROWS + 1
    got = pieces_of([segment(range(5 + count), 0, prompt_len=5)], [0])
    assert got == [Piece(0, 0, 5 + count)]


def test_segment_without_a_prompt_keeps_the_plain_rule():
    bare = ScheduledSegment("probe", [0] * 5, 8, list(range(8)), True, GREEDY)
    assert pieces_of([bare], [0]) == [Piece(0, 0, 5)]


def test_decode_pieces_come_first_and_samples_the_last_row():
    forced = segment([1, 2, 3], 30, prompt_len=30)
    prefill = ScheduledSegment("p", list(range(7)), 0, list(range(64, 72)), True, GREEDY,
                               prompt_token_ids=list(range(7)))
    packed = pack([prefill, forced], 4, [0, 1])
    assert packed.layout.num_decodes == 3
    assert packed.positions == [30, 31, 32, *range(7)]
    assert packed.sample_rows == [9, 2]  # the prefill's last row, the forced segment's last


@needs_native_kernels()
def test_forced_tokens_in_one_pass_equal_one_at_a_time(tiny_model_paths, monkeypatch):
    # The float32 tiles' row limit is timed at load; on a loaded machine it came out under the
    # pass's 5 rows and the stack declined the pass (a flaky []): fix the limit at 16 here.
    monkeypatch.setattr(weight_layout, "_measure_on_representative", lambda linears, dtype: 16)
    runner = ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", dtype="float32",
                              block_size=4, num_blocks=64, compile=False)
    if runner.hooks.owned_model is None:
        pytest.skip("no owned CPU model (and its native decode stack) on this runner")
    if runner.hooks.owned_model.stack is None:  # weight_layout's probe chose torch's products
        pytest.skip("the measured float32 layout gave this model no tiles copies, so no stack")
    prompt = torch.randint(0, 4000, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    outputs = [17, 230, 5, 901, 42]
    blocks_a, blocks_b = list(range(0, 8)), list(range(8, 16))

    def step(rid, tokens, start, blocks):
        seg = ScheduledSegment(rid, tokens, start, blocks, True, GREEDY,
                               prompt_token_ids=prompt, output_token_ids=outputs[:0])
        return runner.forward_batch([seg])[1][0]

    step("a", prompt, 0, blocks_a)
    for k, token in enumerate(outputs):  # one decode pass per output token
        one_at_a_time = step("a", [token], len(prompt) + k, blocks_a)
    step("b", prompt, 0, blocks_b)
    stack = runner.hooks.owned_model.stack
    taken = []
    original = stack.run

    def spy(x, cos, sin, step_meta, tables):
        taken.append(x.shape[0])
        return original(x, cos, sin, step_meta, tables)

    monkeypatch.setattr(stack, "run", spy)
    together = step("b", outputs, len(prompt), blocks_b)  # one pass, like jump-forward
    assert taken == [len(outputs)]  # the decode stack ran the pass, every row
    assert torch.equal(together, one_at_a_time)
    runner.execute(ScheduledBatch(finished_ids=["a", "b"]))
