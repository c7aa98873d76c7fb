"""Quantized linears (GGUF blocks, ``quant.linear.QuantizedLinear``) on the CPU decode path:
fused q/k/v and gate/up groups over concatenated blocks, and the native decode stack running
the blocks (``native.qmatmul``) against the per-op path with the same quantized linears."""

from __future__ import annotations

import pytest
import torch
from _lean_steps import PROMPTS, without_stack
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu import quantized_layout, weight_layout
from langchain_ascend.engine.cpu.fused_projections import fuse_projections, group_of
from langchain_ascend.engine.cpu.models import ops
from langchain_ascend.engine.cpu.quantized_layout import fused_layout
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.native import stack_kernel as native_stack
from langchain_ascend.quant import formats, quantize
from langchain_ascend.testing import needs_native_kernels
from langchain_ascend.testing.runner_steps import greedy_decode

pytestmark = needs_native_kernels()
linear_module = pytest.importorskip("langchain_ascend.quant.linear")
QuantizedLinear, replace_linears = linear_module.QuantizedLinear, linear_module.replace_linears

GREEDY = SamplingParams(max_tokens=8)


def _quantized_model(path, dtype, fmt, only=None):
    """The model at ``path`` with its linears (those whose name contains ``only``, default
    all, the LM head included) quantized to ``fmt``."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    replace_linears(model, lambda name, linear: quantize(linear.weight.data, fmt)
                    if only is None or only in name else None)
    return model


def _runner(path, dtype, fmt, *, stack, only=None):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weight_layout, "measure_native_max_rows", lambda linear: 64)
        model = _quantized_model(path, dtype, fmt, only)
        runner = ModelRunner.from_model(model, num_blocks=64, block_size=4, compile=False)
    return runner if stack else without_stack(runner)


def _decode_logits(runner, prompts, tables, first=0):
    """Prefill ``prompts`` on ``tables``, then the logits of one pure-decode step."""
    runner.forward_batch([ScheduledSegment(f"r{first + i}", p, 0, tables[i], True, GREEDY)
                          for i, p in enumerate(prompts)])
    return runner.forward_batch([ScheduledSegment(f"r{first + i}", [7 + first + i], len(p),
                                                  tables[i], True, GREEDY)
                                 for i, p in enumerate(prompts)])[1]


def test_quantized_groups_fuse_into_one_product_over_views(tiny_model_paths):
    model = _quantized_model(tiny_model_paths["qwen2"], torch.float32, "q4_1")
    attention = model.model.layers[0].self_attn
    members = [attention.q_proj, attention.k_proj, attention.v_proj]
    x = torch.randn(3, model.config.hidden_size)
    layout = fused_layout([m.qweight for m in members])  # "x8" where the native product is
    want = [QuantizedLinear(formats.to_layout(m.qweight, layout), m.bias)(x) for m in members]
    groups = fuse_projections(model)
    assert len(groups) == 2 * model.config.num_hidden_layers
    group = group_of(groups, members)
    assert isinstance(group.linear, QuantizedLinear) and group.linear.fmt == "q4_1"
    assert group.linear.out_features == sum(m.out_features for m in members)
    assert group.linear.layout == layout and all(m.layout == layout for m in members)
    fused = group.linear.qweight.blocks
    for m in members:  # the members' blocks and biases are views of the fused ones
        assert m.qweight.blocks.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
        assert m.bias.untyped_storage().data_ptr() == group.linear.bias.untyped_storage().data_ptr()
    got = group.linear(x).split(group.sizes, dim=-1)  # one product, split
    for a, b, m in zip(got, want, members, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(m(x), b)  # each member's own product on its view


def test_packing_relays_blocks_in_place_and_copies_shared_ones(tiny_model_paths):
    from langchain_ascend.quant.embedding import QuantizedEmbedding

    model = _quantized_model(tiny_model_paths["qwen2"], torch.float32, "q8_0")
    table = QuantizedEmbedding(model.get_output_embeddings().qweight)  # a tied table
    model.model.embed_tokens = table
    ids = torch.tensor([[3, 99, 4000]])
    rows_before = table(ids)
    x = torch.randn(2, model.config.hidden_size)
    attention = model.model.layers[1].self_attn
    names = ("q_proj", "k_proj", "v_proj")
    want = {"head": model.get_output_embeddings()(x),
            "o": model.model.layers[0].self_attn.o_proj(x),
            **{name: getattr(attention, name)(x) for name in names}}
    groups = fuse_projections(model)
    group = group_of(groups, [getattr(attention, name) for name in names])
    assert group.linear.qweight.layout == "x8"  # concatenated straight into the x8 layout
    before = group.linear.qweight.blocks.untyped_storage().data_ptr()
    assert quantized_layout.pack_quantized_linears(model, groups) == 2 * 2 + 1  # o/down, head
    assert quantized_layout.pack_quantized_linears(model, groups) == 0  # then none
    members = [getattr(attention, name) for name in names]
    assert group_of(groups, members) is group and group.linear.qweight.layout == "x8"
    fused = group.linear.qweight.blocks.untyped_storage().data_ptr()
    assert fused == before  # the groups were not re-laid again
    for member in members:  # views of the re-laid fused blocks
        assert member.qweight.layout == "x8"
        assert member.qweight.blocks.untyped_storage().data_ptr() == fused
        assert member.bias.untyped_storage().data_ptr() == (
            group.linear.bias.untyped_storage().data_ptr())
    head = model.get_output_embeddings()
    assert head.qweight.layout == "x8" and table.qweight.layout == "gguf"  # a copy for the head
    assert torch.equal(table(ids), rows_before)
    got = {"head": head(x), "o": model.model.layers[0].self_attn.o_proj(x),
           **{name: member(x) for name, member in zip(names, members, strict=True)}}
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-5)
    other = torch.randn(3, model.config.hidden_size)  # a member on another input: its slice
    torch.testing.assert_close(members[2](other), group.linear(other)[:, -members[2].out_features:])


def _mixed(model):
    """Layer 0's up_proj in q4_0 and layer 1's v_proj in q4_1 beside q8_0 members (as a
    Q4_K_M file's Q6_K attn_v beside Q4_K q/k)."""
    torch.manual_seed(0)
    for layer, parent, name, fmt in ((0, "mlp", "up_proj", "q4_0"), (1, "self_attn", "v_proj",
                                                                     "q4_1")):
        module = getattr(model.model.layers[layer], parent)
        old = getattr(module, name)
        weight = torch.randn(old.out_features, old.in_features) * 0.05
        setattr(module, name, QuantizedLinear(quantize(weight, fmt), old.bias))
    return model


def test_mixed_formats_fuse_into_parts(tiny_model_paths):
    model = _mixed(_quantized_model(tiny_model_paths["llama"], torch.float32, "q8_0"))
    mlp = model.model.layers[0].mlp
    x = torch.randn(3, model.config.hidden_size)
    want = [mlp.gate_proj(x), mlp.up_proj(x)]
    groups = fuse_projections(model)
    group = group_of(groups, [mlp.gate_proj, mlp.up_proj])
    assert isinstance(group.linear, quantized_layout.QuantizedParts)
    assert group.linear.parts == [mlp.gate_proj, mlp.up_proj]  # their own blocks
    assert torch.equal(group.linear(x), torch.cat(want, dim=-1))
    assert torch.equal(mlp.gate_proj(x), want[0]) and torch.equal(mlp.up_proj(x), want[1])
    single = group_of(groups, [model.model.layers[1].mlp.gate_proj,
                               model.model.layers[1].mlp.up_proj])
    assert isinstance(single.linear, QuantizedLinear)
    assert quantized_layout.pack_quantized_linears(model, groups) > 0
    # each part re-laid in place on its own (x8 sums in another float order: close, not equal)
    assert group.linear.parts == [mlp.gate_proj, mlp.up_proj]
    assert mlp.gate_proj.qweight.layout == "x8" and mlp.up_proj.qweight.layout == "x8"
    torch.testing.assert_close(group.linear(x), torch.cat(want, dim=-1), rtol=1e-4, atol=1e-5)
    assert torch.equal(mlp.up_proj(x), group.linear(x)[:, mlp.gate_proj.out_features:])


def test_the_stack_runs_parts_bit_for_bit_as_the_per_op_path(tiny_model_paths, stack_calls):
    runners = {}
    for stack in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(weight_layout, "measure_native_max_rows", lambda linear: 64)
            model = _mixed(_quantized_model(tiny_model_paths["llama"], torch.float32, "q8_0"))
            runner = ModelRunner.from_model(model, num_blocks=64, block_size=4, compile=False)
            runners[stack] = runner if stack else without_stack(runner)
    layers = runners[True].model.config.num_hidden_layers
    assert runners[True].hooks.changes["owned_layers"] == layers
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    got = _decode_logits(runners[True], PROMPTS, tables)  # (3, V), the stack
    assert stack_calls == [3]
    assert torch.equal(got, _decode_logits(runners[False], PROMPTS, tables))


@pytest.mark.parametrize(("arch", "dtype", "fmt"), [
    ("qwen2", torch.float32, "q4_1"), ("llama", torch.float32, "q4_0"),
    ("qwen3", torch.float32, "q8_0"), ("qwen2", torch.bfloat16, "q8_0"),
    ("llama", torch.bfloat16, "q4_1"), ("qwen3", torch.bfloat16, "q4_0")])
def test_quantized_stack_equals_the_per_op_path(tiny_model_paths, arch, dtype, fmt,
                                                stack_calls):
    stacked = _runner(tiny_model_paths[arch], dtype, fmt, stack=True)
    plain = _runner(tiny_model_paths[arch], dtype, fmt, stack=False)
    layers = stacked.model.config.num_hidden_layers
    assert stacked.hooks.changes["owned_layers"] == layers
    assert plain.hooks.owned_model.stack.max_rows == 0
    head = stacked.model.get_output_embeddings()
    assert isinstance(head, QuantizedLinear) and head.qweight.layout == "x8"  # the head too
    attention = stacked.model.model.layers[0].self_attn
    fused = stacked.hooks.owned_model.layers[0].qkv
    assert fused.qweight.layout == "x8" and attention.k_proj.qweight.layout == "x8"
    tokens = {}
    for name, runner in (("stack", stacked), ("plain", plain)):
        before = len(stack_calls)
        tokens[name] = greedy_decode(runner, PROMPTS, 6, blocks_per_request=6)
        assert stack_calls[before:] == ([3] * 6 if name == "stack" else [])
    assert tokens["stack"] == tokens["plain"]
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    got = _decode_logits(stacked, PROMPTS, tables)  # (3, V)
    want = _decode_logits(plain, PROMPTS, tables)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_stack_rows_do_not_depend_on_the_batch(tiny_model_paths, dtype):
    runner = _runner(tiny_model_paths["llama"], dtype, "q4_1", stack=True)
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    batched = _decode_logits(runner, PROMPTS, tables)  # (3, V)
    for i, prompt in enumerate(PROMPTS):
        solo = _decode_logits(runner, [prompt], [[10 + 4 * i + j for j in range(4)]], first=i)
        assert torch.equal(solo[0], batched[i]), i


def test_stack_mixes_quantized_and_float_products(tiny_model_paths, stack_calls):
    path = tiny_model_paths["qwen2"]
    stacked = _runner(path, torch.float32, "q4_0", stack=True, only="mlp")
    plain = _runner(path, torch.float32, "q4_0", stack=False, only="mlp")
    layer = stacked.model.model.layers[0]
    assert isinstance(layer.mlp.down_proj, QuantizedLinear)
    assert isinstance(layer.self_attn.o_proj, torch.nn.Linear)
    assert stacked.hooks.changes["owned_layers"] == stacked.model.config.num_hidden_layers
    assert stacked.hooks.owned_model.stack.max_rows == 64  # the float products' limit
    assert (greedy_decode(stacked, PROMPTS, 5, blocks_per_request=6)
            == greedy_decode(plain, PROMPTS, 5, blocks_per_request=6))
    assert stack_calls == [3] * 5


@pytest.mark.parametrize(("arch", "fmt"), [("llama", "q4_1"), ("qwen2", "q8_0"),
                                           ("qwen3", "q4_0")])
def test_per_op_decode_rows_equal_the_stack_bit_for_bit(tiny_model_paths, arch, fmt,
                                                         stack_calls):
    """Issue 23: a decoding row gets the same float32 bits whether its step ran in the native
    stack or per op -- on a pure-decode step, and beside a prefill longer than the norms'
    decode-sized row limit (the per-op path then runs every row, the decode's included)."""
    stacked = _runner(tiny_model_paths[arch], torch.float32, fmt, stack=True)
    plain = _runner(tiny_model_paths[arch], torch.float32, fmt, stack=False)
    assert all(layer.native_silu for layer in stacked.hooks.owned_model.layers)
    assert all(layer.native_silu for layer in plain.hooks.owned_model.layers)
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    got = _decode_logits(stacked, PROMPTS, tables)  # (3, V), the stack
    assert stack_calls == [3]
    assert torch.equal(got, _decode_logits(plain, PROMPTS, tables))  # per op
    long_prompt = [(11 * i) % 200 + 1 for i in range(90)]  # > rms_norm.MAX_ROWS tokens
    for i, prompt in enumerate(PROMPTS):
        table, other = [20 + 4 * i + j for j in range(4)], list(range(40, 64))
        stacked.forward_batch([ScheduledSegment("d", prompt, 0, table, True, GREEDY)])
        _, mixed = stacked.forward_batch([  # one decode row beside a fresh 90-token prefill
            ScheduledSegment("d", [7 + i], len(prompt), table, True, GREEDY),
            ScheduledSegment("p", long_prompt, 0, other, True, GREEDY)])
        stacked.release(["d", "p"])
        assert torch.equal(mixed[0], got[i]), i
    # the lone prefills ran in the stack, the mixed steps per op
    assert stack_calls == [3] + [len(prompt) for prompt in PROMPTS]


@pytest.mark.parametrize(("arch", "fmt"), [("llama", "q4_0"), ("qwen3", "q4_1")])
def test_a_lone_prefill_runs_in_the_stack_with_the_per_op_bits(tiny_model_paths, arch, fmt,
                                                                stack_calls):
    """A step that is one prefill segment (a chat turn, a tool result) runs in the stack: its
    tokens as the one-row decodes at their positions, the per-op path's kernels, so the same
    logits and cache, bit for bit, after a cached prefix too."""
    stacked = _runner(tiny_model_paths[arch], torch.float32, fmt, stack=True)
    plain = _runner(tiny_model_paths[arch], torch.float32, fmt, stack=False)
    first = [(7 * i) % 150 + 3 for i in range(40)]
    more = [(5 * i) % 90 + 11 for i in range(23)]
    table = list(range(20))
    outs = {}
    for name, runner in (("stack", stacked), ("plain", plain)):
        before = len(stack_calls)
        _, a = runner.forward_batch([ScheduledSegment("r", first, 0, table, True, GREEDY)])
        _, b = runner.forward_batch([ScheduledSegment("r", more, len(first), table, True,
                                                      GREEDY)])
        outs[name] = (a, b, [t.clone() for t in runner.kv_cache.tensors])
        assert stack_calls[before:] == ([40, 23] if name == "stack" else [])
    for got, want in zip(outs["stack"][:2], outs["plain"][:2], strict=True):
        assert torch.equal(got, want)
    for got, want in zip(outs["stack"][2], outs["plain"][2], strict=True):
        assert torch.equal(got, want)


def test_the_mlp_of_quantized_products_runs_the_stack_silu(tiny_model_paths):
    runner = _runner(tiny_model_paths["llama"], torch.float32, "q4_1", stack=True)
    layer = runner.hooks.owned_model.layers[0]
    width = layer.intermediate
    x = 4 * torch.randn(70, runner.model.config.hidden_size)
    gate_up = layer.gate_up.forward(x)  # (70, 2I)
    act = native_stack.silu_mul(gate_up)  # (70, I)
    gate, up = gate_up.split([width, width], dim=-1)
    torch.testing.assert_close(act, torch.nn.functional.silu(gate) * up)  # same up to a bit
    with torch.inference_mode():
        assert torch.equal(ops.mlp(x, layer.gate_up, layer.down, width, True),
                           layer.down.forward(act))
    solo = torch.cat([native_stack.silu_mul(gate_up[t:t + 1]) for t in range(70)])
    assert torch.equal(solo, act)  # each row the same whatever the rows beside it


def test_a_long_prefill_mlp_runs_in_row_chunks_with_the_same_bits(tiny_model_paths, monkeypatch):
    runner = _runner(tiny_model_paths["llama"], torch.float32, "q4_0", stack=True)
    layer = runner.hooks.owned_model.layers[0]
    width = layer.intermediate
    chunk = ops.mlp_row_chunk(2 * width)
    assert chunk % 64 == 0 and chunk * 4 * 2 * width <= ops.MLP_CHUNK_BYTES
    assert ops.mlp_row_chunk(16384) == 256 and ops.mlp_row_chunk(10**9) == 64
    monkeypatch.setattr(ops, "MLP_CHUNK_BYTES", 64 * 4 * 2 * width)
    rows = 2 * 64 + 37  # three chunks of 64 rows at this (tiny) width, the last one short
    x = 4 * torch.randn(rows, runner.model.config.hidden_size)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.inference_mode():
            chunked = ops.mlp(x, layer.gate_up, layer.down, width, True)  # (rows, hidden)
            whole = ops._mlp_rows(x, layer.gate_up, layer.down, width, True)
            torch.set_num_threads(1)  # the SiLU's rows shared by 2 threads, or not
            one_thread = ops._mlp_rows(x, layer.gate_up, layer.down, width, True)
    finally:
        torch.set_num_threads(previous)
    assert chunked.shape == x.shape
    assert torch.equal(chunked, whole) and torch.equal(whole, one_thread)
