"""The static decode step: fixed buffers, padding on the scratch block, greedy parity with the
eager step, one graph under ``torch.compile(fullgraph=True)``, and a K/V write that inductor
keeps in place (no copy of the whole cache per layer per step)."""

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
    """The CPU-prepared model (native fused linears) traces as one graph: under
    ``torch.compile`` its ``DualLinear`` products run ``F.linear`` (``engine.cpu.dual_linear``), and
    the compiled step matches the eager one, which took the native kernels."""
    runner = ModelRunner.load(tiny_model_paths[arch], device="cpu", block_size=BLOCK,
                              num_blocks=40, compile="static", max_batch_size=4)
    assert runner.hooks.changes["fused_groups"] > 0
    static, key = runner.static, (4, 4)
    static.stage(key)
    with torch.inference_mode():
        eager = static.run(key)
        explained = torch._dynamo.explain(static.step_fn)(*static.views(key))
        compiled = torch.compile(static.step_fn, backend="eager", fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(*static.views(key)), eager, rtol=1e-4, atol=1e-5)
    assert explained.graph_count == 1 and explained.graph_break_count == 0


def inductor_graph(fn, *args):
    """``fn(*args)`` compiled by inductor's front end (dynamo, AOT functionalization, the
    post-grad passes that turn functional writes back into in-place ones) and run as the
    resulting FX graph, without inductor's code generation (which takes half a minute even
    for the tiny model). Returns ``(outputs, [post-grad graph modules])``.

    Uses inductor internals of the pinned torch (``compile_fx``'s ``inner_compile``,
    ``_recursive_post_grad_passes``); the graph and autograd caches are off so the passes
    really run.
    """
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import _recursive_post_grad_passes, compile_fx
    from torch._inductor.virtualized import V

    graphs = []

    def inner(gm, example_inputs, **kwargs):
        with V.set_fake_mode(torch._guards.detect_fake_mode(example_inputs)):
            _recursive_post_grad_passes(gm, is_inference=True)
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args)
    finally:
        torch._dynamo.reset()
    return out, graphs


def new_tensors_of_at_least(graph, numel: int) -> list[str]:
    """Nodes of ``graph`` that make a NEW tensor of ``numel`` elements or more (a copy, a
    scatter, a clone), or ``copy_`` one into an input; views and in-place writes of an
    existing tensor do not count."""
    found = []
    for node in graph.graph.nodes:
        val = node.meta.get("val")
        if node.op != "call_function" or not isinstance(val, torch.Tensor):
            continue
        if val.numel() < numel:
            continue
        schema = getattr(node.target, "_schema", None)
        aliases = schema is not None and bool(schema.returns) and \
            schema.returns[0].alias_info is not None
        if not aliases or node.target is torch.ops.aten.copy_.default:
            found.append(f"{node.target}{tuple(val.shape)}")
    return found


@pytest.mark.parametrize("blocks_dim", [2, 1], ids=["cpu-layout", "npu-layout"])
def test_compiled_static_step_writes_kv_in_place(tiny_model_paths, blocks_dim):
    """The reference K/V write is one ``index_put_`` on the cache's own view, which inductor
    keeps in place; a write through ``slots[0]`` / ``slots[1]`` (the old code) becomes a
    ``select_scatter`` of the whole layer cache and a ``copy_`` back, every layer, every
    step. The cache is made the largest tensor of the step, so any whole-cache copy shows."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen3"],
                                                 attn_implementation=registry.register())
    model.eval()
    layers, _, kv_heads, head_dim = hf_config.attention_geometry(model.config)
    num_blocks = 1025  # one layer's cache (2*2*1025*4*32 elements) > any weight or logits
    shape = ((2, kv_heads, num_blocks, BLOCK, head_dim) if blocks_dim == 2
             else (2, num_blocks, BLOCK, kv_heads, head_dim))
    caches = [torch.zeros(shape) for _ in range(layers)]
    static = StaticDecodeStep(model, kv_caches=caches, blocks_dim=blocks_dim, block_size=BLOCK,
                              scratch_block_id=num_blocks - 1, max_batch_size=4,
                              max_model_len=64, device=torch.device("cpu"))
    key = (4, 4)
    static.stage(key)  # padding rows only: every row writes the scratch block
    with torch.inference_mode():
        eager = static.run(key)
        for cache in caches:
            cache.zero_()
        compiled, graphs = inductor_graph(static.step_fn, *static.views(key))
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    assert len(graphs) == 1
    numel = caches[0].numel()
    assert max(p.numel() for p in model.parameters()) < numel
    assert new_tensors_of_at_least(graphs[0], numel) == []
    for cache in caches:  # the graph's write reached the cache itself, only the scratch block
        assert cache.select(blocks_dim, num_blocks - 1).any()
        rest = cache.clone()
        rest.select(blocks_dim, num_blocks - 1).zero_()
        assert not rest.any()
