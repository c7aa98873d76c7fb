"""The native decode stack: every layer of a pure-decode step in one native call."""

from __future__ import annotations

import pytest
import torch
from _lean_steps import PROMPTS, prepared_runner

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.native import stack_kernel as native_stack
from langchain_ascend.testing import needs_native_kernels
from langchain_ascend.testing.runner_steps import greedy_decode

pytestmark = needs_native_kernels()

GREEDY = SamplingParams(max_tokens=8)


def _runner(path, dtype, *, stack):
    return prepared_runner(path, dtype, stack=stack)


def _decode_logits(runner, prompts, tables):
    """Prefill ``prompts`` on ``tables``, then the logits of one pure-decode step."""
    runner.forward_batch([ScheduledSegment(f"r{i}", p, 0, tables[i], True, GREEDY)
                          for i, p in enumerate(prompts)])
    return runner.forward_batch([ScheduledSegment(f"r{i}", [7 + i], len(p), tables[i], True,
                                                  GREEDY) for i, p in enumerate(prompts)])[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_stack_equals_the_per_op_path(tiny_model_paths, arch, dtype,
                                      stack_calls):
    stacked = _runner(tiny_model_paths[arch], dtype, stack=True)
    plain = _runner(tiny_model_paths[arch], dtype, stack=False)
    layers = stacked.model.config.num_hidden_layers
    assert stacked.hooks.changes["owned_layers"] == layers
    assert plain.hooks.owned_model.stack.max_rows == 0
    prompts = PROMPTS
    tokens = {}
    for name, runner in (("stack", stacked), ("plain", plain)):
        before = len(stack_calls)
        tokens[name] = greedy_decode(runner, prompts, 6, blocks_per_request=6)
        used = stack_calls[before:]
        # unrelated contexts: every decode step goes through the stack, the prefill does not
        assert used == ([3] * 6 if name == "stack" else [])
    assert tokens["stack"] == tokens["plain"]
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    got = _decode_logits(stacked, prompts, tables)  # (3, V)
    want = _decode_logits(plain, prompts, tables)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_stack_writes_the_same_cache(tiny_model_paths):
    stacked = _runner(tiny_model_paths["qwen3"], torch.bfloat16, stack=True)
    plain = _runner(tiny_model_paths["qwen3"], torch.bfloat16, stack=False)
    prompts, tables = [[5, 17, 300, 41, 9], [8, 8, 100]], [[0, 1], [2, 3]]
    for runner in (stacked, plain):
        _decode_logits(runner, prompts, tables)
    for got, want in zip(stacked.kv_cache.tensors, plain.kv_cache.tensors, strict=True):
        assert torch.equal(got, want)  # rotary + cache write: the same kernel, bit for bit


def test_steps_the_stack_does_not_take_run_the_per_op_path(tiny_model_paths,
                                                           stack_calls):
    runner = _runner(tiny_model_paths["llama"], torch.float32, stack=True)
    # a step that is one prefill segment: the stack; a mixed step (a decode and a prefill
    # chunk) or prefills of several requests: per-op
    runner.forward_batch([ScheduledSegment("a", [1, 2, 3, 4, 5], 0, [0, 1], True, GREEDY)])
    assert stack_calls == [5]
    runner.forward_batch([ScheduledSegment("a", [6], 5, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [7, 8, 9], 0, [2], True, GREEDY)])
    runner.forward_batch([ScheduledSegment("c", [7, 8, 9], 0, [3], True, GREEDY),
                          ScheduledSegment("d", [7, 8], 0, [4], True, GREEDY)])
    assert stack_calls == [5]
    stack_calls.clear()
    # decodes sharing a cached prefix run in the stack too: its paged kernel groups the rows
    # that read the same blocks, each row summed exactly as alone
    prefix = list(range(1, 17))
    segs = [ScheduledSegment(f"s{i}", prefix + [20 + i], 0, [10, 11, 12, 13, 14 + i], True,
                             GREEDY) for i in range(4)]
    runner.forward_batch(segs[:1])
    runner.forward_batch([ScheduledSegment(f"s{i}", [20 + i], 16, [10, 11, 12, 13, 14 + i],
                                           True, GREEDY) for i in range(1, 4)])
    shared = [ScheduledSegment(f"s{i}", [30 + i], 17, [10, 11, 12, 13, 14 + i], True, GREEDY)
              for i in range(4)]
    runner.forward_batch(shared)
    assert stack_calls == [17, 3, 4]
    stack_calls.clear()
    # more rows than the stack's limit: per-op
    runner.hooks.owned_model.stack.max_rows = 1
    runner.forward_batch([ScheduledSegment("a", [6], 5, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [10], 3, [2], True, GREEDY)])
    assert stack_calls == []
    runner.forward_batch([ScheduledSegment("a", [11], 6, [0, 1], True, GREEDY)])
    assert stack_calls == [1]


def test_stack_refuses_bad_tensors_with_typed_errors(tiny_model_paths):
    runner = _runner(tiny_model_paths["qwen2"], torch.float32, stack=True)
    stack = runner.hooks.owned_model.stack
    heads, kv_heads, head_dim, intermediate = stack.geometry
    size = runner.model.config.hidden_size
    cache = runner.kv_cache.tensors[0]
    for record, tensor in zip(stack.layers, runner.kv_cache.tensors, strict=True):
        record.kv_cache = tensor.data_ptr()
    scratch = torch.empty(native_stack.scratch_elements(1, size, heads, kv_heads, head_dim,
                                                        intermediate))
    args = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                num_blocks=cache.shape[2], block_size=cache.shape[3], split_keys=256,
                scratch=scratch)
    hidden, cos, sin = torch.randn(1, size), torch.ones(1, head_dim), torch.zeros(1, head_dim)
    tables, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([1])
    outside = torch.tensor([cache.shape[2] * cache.shape[3]])  # one slot past the cache
    with pytest.raises(ValueError, match="outside the cache"):
        native_stack.run_stack(stack.layers, hidden, cos, sin, outside, tables, lens, **args)
    with pytest.raises(ValueError, match="unexpected step tensors"):
        native_stack.run_stack(stack.layers, hidden, cos, sin, torch.tensor([0]),
                               tables.long(), lens, **args)
    with pytest.raises(ValueError, match="scratch"):
        native_stack.run_stack(stack.layers, hidden, cos, sin, torch.tensor([0]), tables,
                               lens, **{**args, "scratch": scratch[:10]})
