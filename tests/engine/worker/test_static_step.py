"""The static decode step: fixed buffers, padding on the scratch block, greedy parity with the
eager step, and one graph under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.attention import registry
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.worker.kv_cache import KVCache
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.engine.worker.static_step import (
    StaticDecodeStep,
    bucket_for,
    capture_sizes,
    table_widths,
)
from langchain_ascend.testing import ARCHITECTURES
from langchain_ascend.testing.runner_steps import greedy_decode

BLOCK = 4
GREEDY = SamplingParams(max_tokens=64)
PROMPT_LENGTHS = {1: [9], 3: [3, 14, 22]}  # batch 3 is padded to the bucket of 4


def prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, 4000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate(runner, prompts: list[list[int]], num_new: int = 10) -> list[list[int]]:
    """Greedy tokens of ``prompts`` decoded together (prefill, then ``num_new`` decodes)."""
    width = -(-(max(map(len, prompts)) + num_new + 1) // BLOCK)
    return greedy_decode(runner, prompts, num_new, blocks_per_request=width)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def runners(request, tiny_model_paths):
    """(eager runner, static-step runner) on the same tiny checkpoint."""
    path = str(tiny_model_paths[request.param])
    eager = ModelRunner.load(path, device="cpu", block_size=BLOCK, num_blocks=96, compile=False)
    static = ModelRunner.load(path, device="cpu", block_size=BLOCK, num_blocks=96,
                              compile="static", max_batch_size=8)
    return eager, static


@pytest.mark.parametrize("batch", sorted(PROMPT_LENGTHS))
def test_static_step_greedy_tokens_equal_the_eager_step(runners, batch):
    eager, static = runners
    assert static.compiler.plan == "static" and eager.static is None
    prompts = [prompt(10 * batch + i, n) for i, n in enumerate(PROMPT_LENGTHS[batch])]
    calls = []
    original = static.static.run
    static.static.run = lambda key: calls.append(key) or original(key)  # type: ignore[method-assign]
    try:
        assert generate(static, prompts) == generate(eager, prompts)
    finally:
        del static.static.run
    assert calls and {rows for rows, _ in calls} == {1 if batch == 1 else 4}


def test_buckets():
    assert capture_sizes(1) == [1] and capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert table_widths(100) == [4, 8, 16, 32, 64, 100] and table_widths(3) == [3]
    assert bucket_for(3, [1, 2, 4]) == 4 and bucket_for(5, [1, 2, 4]) is None


def test_buffers_keep_shapes_and_addresses_across_steps_and_buckets(runners):
    _, runner = runners
    static = runner.static
    buffer_ptr = static.device_buffer.data_ptr()
    seen: dict[tuple[int, int], list[tuple]] = {}
    original = static.step_fn

    def record(*views):
        key = (views[0].shape[0], views[3].shape[1])
        seen.setdefault(key, []).append(tuple((v.shape, v.dtype, v.data_ptr()) for v in views))
        return original(*views)

    static.step_fn = record  # type: ignore[method-assign]
    try:
        generate(runner, [prompt(1, 5)], num_new=4)
        generate(runner, [prompt(2, 5), prompt(3, 30)], num_new=4)  # wider table: width 16
        generate(runner, [prompt(4, 6)], num_new=4)
    finally:
        del static.step_fn
    assert set(seen) == {(1, 4), (2, 8), (2, 16)}  # the table widens from 8 to 16 blocks
    assert len(seen[(1, 4)]) == 8
    for records in seen.values():
        assert len(set(records)) == 1  # same shapes, dtypes and addresses at every step
    rows, width = 2, 16
    ids, positions, slots, tables, lens, key_positions = seen[(rows, width)][0]
    assert [s for s, _, _ in (ids, positions, slots, lens)] == [torch.Size([rows])] * 4
    assert tables == (torch.Size([rows, width]), torch.int32, tables[2])
    assert static.device_buffer.data_ptr() == buffer_ptr


def test_padding_rows_never_write_a_real_block(runners):
    _, runner = runners
    cache, static = runner.kv_cache, runner.static
    prompts = [prompt(7, 6), prompt(8, 9), prompt(9, 3)]  # 3 rows -> bucket 4: one padding row
    tables = [[0, 1, 2], [3, 4, 5], [6, 7]]
    runner.execute(ScheduledBatch(segments=[
        ScheduledSegment(f"p{i}", p, 0, tables[i], True, GREEDY) for i, p in enumerate(prompts)]))
    real = [cache.block(layer, b).clone() for layer in range(cache.num_layers)
            for b in range(runner.num_blocks)]
    segs = [ScheduledSegment(f"p{i}", [5], len(p), tables[i], True, GREEDY)
            for i, p in enumerate(prompts)]
    layout_slots = {t[len(p) // BLOCK] * BLOCK + len(p) % BLOCK for t, p in zip(tables, prompts, strict=True)}
    runner.execute(ScheduledBatch(segments=segs))
    n = static.max_batch
    slots = static.host_buffer[2 * n: 2 * n + 4].tolist()
    assert set(slots[:3]) == layout_slots and slots[3] == runner.scratch_block_id * BLOCK
    after = [cache.block(layer, b) for layer in range(cache.num_layers)
             for b in range(runner.num_blocks)]
    changed = {(i % runner.num_blocks) for i, (a, b) in enumerate(zip(real, after, strict=True))
               if not torch.equal(a, b)}
    assert changed == {t[len(p) // BLOCK] for t, p in zip(tables, prompts, strict=True)}
    runner.release([f"p{i}" for i in range(3)])


def test_mixed_and_oversized_steps_stay_eager(runners):
    _, runner = runners
    calls = []
    original = runner.static.run
    runner.static.run = lambda key: calls.append(key) or original(key)  # type: ignore[method-assign]
    try:
        generate(runner, [prompt(11, 4)] * 9, num_new=1)  # 9 rows > the largest bucket (8)
        runner.execute(ScheduledBatch(segments=[
            ScheduledSegment("m0", [1, 2, 3], 0, [80], True, GREEDY),
            ScheduledSegment("m1", [4], 3, [81], True, GREEDY)]))
    finally:
        del runner.static.run
    assert calls == []
    runner.release(["m0", "m1"])


def plain_static_step(path, *, max_batch_size=4, max_model_len=64):
    """A static step over a model without the CPU seam's native kernels (those are not torch
    custom ops yet, see ``engine.worker.compile``)."""
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=registry.register())
    model.eval()
    layers, heads, kv_heads, head_dim = hf_config.attention_geometry(model.config)
    backend = TorchRefBackend(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                              dtype=torch.float32, device=torch.device("cpu"))
    cache = KVCache(backend, num_layers=layers, num_blocks=17, block_size=BLOCK)
    return StaticDecodeStep(model, kv_caches=cache.tensors, blocks_dim=backend.blocks_dim,
                            block_size=BLOCK, scratch_block_id=16,
                            max_batch_size=max_batch_size, max_model_len=max_model_len,
                            device=torch.device("cpu"))


def test_static_step_is_one_graph_under_fullgraph_compile(tiny_model_paths):
    static = plain_static_step(tiny_model_paths["qwen3"])
    key = (4, 8)
    static.stage(key)
    with torch.inference_mode():
        eager = static.run(key)
        explained = torch._dynamo.explain(static.step_fn)(*static.views(key))
        compiled = torch.compile(static.step_fn, backend="eager", fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(*static.views(key)), eager)
    assert explained.graph_count == 1 and explained.graph_break_count == 0


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_prepared_static_step_is_one_graph(tiny_model_paths, arch):
    """The CPU-prepared model (native linears, norms, lean attention) traces as one graph:
    under ``torch.compile`` its swapped modules run their class forwards (``engine.cpu.swap``),
    and the compiled step matches the eager one, which took the native kernels."""
    runner = ModelRunner.load(tiny_model_paths[arch], device="cpu", block_size=BLOCK,
                              num_blocks=40, compile="static", max_batch_size=4)
    assert runner.hooks.changes["lean_attention"] > 0 and runner.hooks.changes["fused_norms"] > 0
    static, key = runner.static, (4, 4)
    static.stage(key)
    with torch.inference_mode():
        eager = static.run(key)
        explained = torch._dynamo.explain(static.step_fn)(*static.views(key))
        compiled = torch.compile(static.step_fn, backend="eager", fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(*static.views(key)), eager, rtol=1e-4, atol=1e-5)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
