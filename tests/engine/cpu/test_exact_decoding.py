"""Issue 23: a row's logits do not depend on how its step ran, bit for bit: decodes sharing a
cached prefix equal each decode alone, and a speculative verify pass's rows equal the one-row
decodes at their positions. With quantized weights (q4_1 / q8_0 blocks, int8 activations) in
the native stack (pure-decode steps) and per op (beside a prefill); with float32 float weights
in the stack (per op, a step of more rows than the native float products take runs torch's
products, which round a row differently)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu import weight_layout
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing import needs_native_kernels

pytestmark = needs_native_kernels()
linear_module = pytest.importorskip("langchain_ascend.quant.linear")

GREEDY = SamplingParams(max_tokens=8)
BLOCK = 4
PREFIX = [(13 * i) % 150 + 3 for i in range(24)]  # six blocks every request shares
TAILS = [[5, 9, 11], [40, 41, 42, 43, 44, 45, 46], [77]]
LONG_PROMPT = [(11 * i) % 200 + 1 for i in range(90)]


def _runner(path, fmt):
    """A float32 runner of the model at ``path``, its linears quantized to ``fmt`` (None:
    float weights), block size 4."""
    from langchain_ascend.quant import quantize

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weight_layout, "measure_native_max_rows", lambda linear: 64)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if fmt is not None:
            linear_module.replace_linears(
                model, lambda name, linear: quantize(linear.weight.data, fmt))
        return ModelRunner.from_model(model, num_blocks=96, block_size=BLOCK, compile=False)


@pytest.fixture(scope="module", params=[("llama", "q4_1"), ("qwen2", "q8_0"), ("qwen3", None)],
                ids=["llama-q4_1", "qwen2-q8_0", "qwen3-float"])
def runner(request, tiny_model_paths):
    arch, fmt = request.param
    built = _runner(tiny_model_paths[arch], fmt)
    built.exact_per_op = fmt is not None  # see the module docstring
    return built


def seg(rid, tokens, start, table, drafts=()):
    return ScheduledSegment(rid, list(tokens), start, table, True, GREEDY,
                            draft_token_ids=list(drafts))


def _prefill_shared(runner):
    """Request ``s`` with PREFIX (blocks 0-5, computed once, by s0) and its tail (its own
    blocks after them); returns the tables."""
    tables = [list(range(6)) + [10 + 8 * s + j for j in range(6)] for s in range(len(TAILS))]
    runner.forward_batch([seg("s0", PREFIX + TAILS[0], 0, tables[0])])
    runner.forward_batch([seg(f"s{s}", TAILS[s], len(PREFIX), tables[s])
                          for s in range(1, len(TAILS))])
    return tables


def test_decodes_sharing_a_prefix_equal_each_decode_alone(runner):
    tables = _prefill_shared(runner)
    lens = [len(PREFIX) + len(t) for t in TAILS]
    decodes = [seg(f"s{s}", [90 + s], lens[s], tables[s]) for s in range(len(TAILS))]
    _, batched = runner.forward_batch(decodes)  # (3, V): one step over the shared blocks
    for s, decode in enumerate(decodes):
        _, alone = runner.forward_batch([decode])
        assert torch.equal(alone[0], batched[s]), s
    # beside a prefill the step runs per op: the decodes' rows keep their bits
    _, mixed = runner.forward_batch([*decodes, seg("p", LONG_PROMPT, 0, list(range(60, 84)))])
    assert torch.equal(mixed[:3], batched) or not runner.exact_per_op
    runner.release([d.request_id for d in decodes] + ["p"])


def test_verify_pass_rows_equal_the_one_row_decodes(runner):
    table = list(range(30, 45))
    prompt = PREFIX[:19]
    runner.forward_batch([seg("v", prompt, 0, table)])
    tokens = [7, 8, 9, 10, 11]  # the pending token, then four drafts
    decoded = [runner.forward_batch([seg("v", [t], len(prompt) + i, table)])[1][0]
               for i, t in enumerate(tokens)]  # one-row decodes, position by position
    _, verified = runner.forward_batch([seg("v", tokens, len(prompt), table, tokens[1:])])
    assert verified.shape[0] == len(tokens)
    for i, row in enumerate(decoded):
        assert torch.equal(verified[i], row), i
    # the same pass beside other decodes sharing its blocks and a prefill (per op)
    _, mixed = runner.forward_batch([
        seg("w", [3], len(prompt), table[:4] + list(range(50, 56))),
        seg("v", tokens, len(prompt), table, tokens[1:]),
        seg("p", LONG_PROMPT, 0, list(range(60, 84)))])
    assert torch.equal(mixed[1:1 + len(tokens)], verified) or not runner.exact_per_op
    runner.release(["v", "w", "p"])


def test_verify_pass_after_several_known_tokens_keeps_their_prefill(runner):
    """Known tokens before the drafts (e.g. forced text) run as the prefill they are without
    drafts; each draft row then equals the decode at its position (that step runs per op)."""
    if not runner.exact_per_op:
        pytest.skip("float weights: a per-op step rounds a row unlike the stack")
    table = list(range(30, 45))
    prompt, known, drafts = PREFIX[:10], [21, 22, 23], [24, 25]
    runner.forward_batch([seg("k", prompt, 0, table)])
    _, plain = runner.forward_batch([seg("k", known, len(prompt), table)])
    after = [runner.forward_batch([seg("k", [t], len(prompt) + len(known) + i, table)])[1][0]
             for i, t in enumerate(drafts)]
    _, verified = runner.forward_batch([seg("k", known + drafts, len(prompt), table, drafts)])
    assert torch.equal(verified[0], plain[0])
    for i, row in enumerate(after):
        assert torch.equal(verified[1 + i], row), i
    runner.release(["k"])


def test_tokens_decoded_then_reused_give_the_bits_of_a_prefill(runner):
    """An agent's next hop reads its previous output from the cache (retention, a prefix hit)
    or recomputes it (after an eviction): the same text either way. A prompt prefilled at once
    and the same prompt whose last tokens were decoded one by one give the same logits."""
    if not runner.exact_per_op:
        pytest.skip("float weights: a per-op step rounds a row unlike the stack")
    prompt, outputs = LONG_PROMPT[:40], [31, 32, 33, 34, 35, 36]
    _, prefilled = runner.forward_batch([seg("p", prompt + outputs, 0, list(range(30, 45)))])
    table = list(range(50, 65))
    runner.forward_batch([seg("d", prompt, 0, table)])
    for i, token in enumerate(outputs):
        _, decoded = runner.forward_batch([seg("d", [token], len(prompt) + i, table)])
    assert torch.equal(decoded[0], prefilled[0])
    runner.release(["p", "d"])
