"""The owned CPU model of the Llama-style families (issue 34): it holds the weights and runs
every step of the CPU backend's paged path -- pure decodes through the native stack, the rest
per op over the same kernels -- with transformers' values; a family it does not own runs the
HF forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _lean_steps import PROMPTS, assert_owned_matches_transformers, prepared_runner
from transformers import AutoModelForCausalLM, GemmaConfig, GemmaForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu.models import ops
from langchain_ascend.engine.cpu.models.llama import LlamaModel
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.native import rms_norm as native_rms_norm
from langchain_ascend.testing import needs_native_kernels

GREEDY = SamplingParams(max_tokens=8)


def _calls(runner, monkeypatch) -> dict[str, list[int]]:
    """Rows of every step the runner ran through its owned model, and through its stack."""
    calls: dict[str, list[int]] = {"owned": [], "stack": []}
    owned = runner.hooks.owned_model
    hidden, run = owned.hidden, owned.stack.run

    def spy_hidden(input_ids, position_ids, step):
        calls["owned"].append(input_ids.shape[1])
        return hidden(input_ids, position_ids, step)

    def spy_run(x, cos, sin, step, tables):
        calls["stack"].append(x.shape[0])
        return run(x, cos, sin, step, tables)

    monkeypatch.setattr(owned, "hidden", spy_hidden)
    monkeypatch.setattr(owned.stack, "run", spy_run)
    return calls


def _hf_next_logits(model, ids: list[int]) -> torch.Tensor:
    """``(V,)`` next-token logits of ``ids`` from the model's own HF forward (its own cache
    and attention, nothing of ours)."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_the_owned_model_runs_prefill_and_decode_with_transformers_values(tiny_model_paths,
                                                                         arch, monkeypatch):
    runner = prepared_runner(tiny_model_paths[arch], torch.float32)
    owned = runner.hooks.owned_model
    assert isinstance(owned, LlamaModel)
    assert owned.num_layers == runner.model.config.num_hidden_layers
    assert runner.hooks.changes["owned_layers"] == owned.num_layers
    assert runner.weights["forward"] == "native"
    assert not any("forward" in m.__dict__ for m in runner.model.modules())  # none replaced
    calls = _calls(runner, monkeypatch)
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)
    prefill = runner.forward_batch([ScheduledSegment(f"r{i}", p, 0, tables[i], True, GREEDY)
                                    for i, p in enumerate(PROMPTS)])[1]
    assert calls == {"owned": [sum(map(len, PROMPTS))], "stack": []}  # per op
    torch.testing.assert_close(prefill, torch.stack([_hf_next_logits(reference, p)
                                                     for p in PROMPTS]), atol=1e-4, rtol=1e-4)
    news = [7, 8, 9]
    got = runner.forward_batch([ScheduledSegment(f"r{i}", [news[i]], len(p), tables[i], True,
                                                 GREEDY) for i, p in enumerate(PROMPTS)])[1]
    assert calls["stack"] == [3]  # the pure-decode step: one native call
    want = torch.stack([_hf_next_logits(reference, p + [news[i]])
                        for i, p in enumerate(PROMPTS)])  # (3, V)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@needs_native_kernels()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_owned_and_transformers_forwards_give_the_same_tokens(tiny_model_paths, arch, dtype):
    assert_owned_matches_transformers(tiny_model_paths[arch], dtype, LlamaModel)


@needs_native_kernels()
def test_the_stack_takes_decode_steps_and_lone_prefills(tiny_model_paths, monkeypatch):
    runner = prepared_runner(tiny_model_paths["llama"], torch.float32)
    calls = _calls(runner, monkeypatch)
    runner.forward_batch([ScheduledSegment("a", [1, 2, 3, 4, 5], 0, [0, 1], True, GREEDY)])
    assert calls == {"owned": [5], "stack": [5]}  # one prefill segment: the stack
    runner.forward_batch([ScheduledSegment("a", [6], 5, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [7, 8, 9], 0, [2], True, GREEDY)])
    assert calls == {"owned": [5, 4], "stack": [5]}  # a mixed step: per op
    calls["stack"].clear()
    runner.forward_batch([ScheduledSegment("a", [10], 6, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [11], 3, [2], True, GREEDY)])
    assert calls["stack"] == [2]
    # a verify pass (one known token, two drafts) is packed as decode rows: the stack
    verify = ScheduledSegment("a", [12, 13, 14], 7, [0, 1, 3], True, GREEDY,
                              draft_token_ids=[13, 14])
    runner.forward_batch([verify])
    assert calls["stack"] == [2, 3]
    # more rows than the stack takes: per op, still the owned model
    runner.hooks.owned_model.stack.max_rows = 1
    runner.forward_batch([ScheduledSegment("a", [15], 10, [0, 1, 3], True, GREEDY),
                          ScheduledSegment("b", [16], 4, [2, 4], True, GREEDY)])
    assert calls == {"owned": [5, 4, 2, 3, 2], "stack": [2, 3]}


@needs_native_kernels()
def test_no_owned_model_without_fused_products(tiny_model_paths):
    row = prepared_runner(tiny_model_paths["qwen2"], torch.float32, weight_layout_name="row")
    assert row.hooks.owned_model is None and row.hooks.changes["owned_layers"] == 0
    assert row.weights["forward"] == "transformers"


def _tiny_gemma() -> GemmaForCausalLM:
    """A family the owned model does not cover (Gemma: scaled embeddings, ``1 + w`` norms)."""
    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=128)
    return GemmaForCausalLM(config).eval()


@pytest.mark.parametrize("quantized", [False, True])
def test_an_unknown_family_gets_no_owned_model_and_runs_the_hf_forward(quantized):
    model = _tiny_gemma()
    if quantized:  # its linears run from their blocks in the HF forward
        linear_module = pytest.importorskip("langchain_ascend.quant.linear")
        from langchain_ascend.quant import quantize

        linear_module.replace_linears(
            model, lambda name, linear: quantize(linear.weight.data, "q8_0"))
    prompt = [5, 17, 300, 41, 9]
    want = _hf_next_logits(model, prompt + [7])  # (V,), before the runner prepares it
    # float32 keys and values (quantized weights would get a float16 cache): compared with
    # the HF forward's own attention
    runner = ModelRunner.from_model(model, num_blocks=16, block_size=4, compile=False,
                                    kv_cache_dtype="float32")
    assert runner.hooks.owned_model is None and runner.hooks.changes["owned_layers"] == 0
    assert runner.weights["forward"] == "transformers"
    runner.forward_batch([ScheduledSegment("a", prompt, 0, [0, 1], True, GREEDY)])
    got = runner.forward_batch([ScheduledSegment("a", [7], 5, [0, 1], True, GREEDY)])[1]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)


@needs_native_kernels()
def test_rms_norm_matches_transformers(tiny_model_paths, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen3"], dtype=torch.float32)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    x = 3 * torch.randn(9, model.config.hidden_size)
    heads = torch.randn(9, 4, model.config.head_dim)
    with torch.inference_mode():
        for module in norms:
            rows = x if module.weight.shape[0] == x.shape[1] else heads
            got = ops.rms_norm(rows, module.weight, module.variance_epsilon)
            torch.testing.assert_close(got, module(rows), atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(native_rms_norm, "rms_norm", lambda *args, **kwargs: None)
        module = model.model.norm  # no native kernel: torch's fused op, transformers' bits
        assert torch.equal(ops.rms_norm(x, module.weight, module.variance_epsilon),
                           F.rms_norm(x, module.weight.shape, module.weight,
                                      module.variance_epsilon))


@needs_native_kernels()
@pytest.mark.parametrize("native", [True, False])
def test_bf16_rms_norm_is_transformers_bit_for_bit(tiny_model_paths, native, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.bfloat16)
    module = model.model.norm
    if not native:  # the torch fallback keeps transformers' rounding order too
        monkeypatch.setattr(native_rms_norm, "rms_norm_bf16", lambda *args, **kwargs: None)
    with torch.inference_mode():
        for rows in (1, 9, 70):
            x = (3 * torch.randn(rows, model.config.hidden_size)).to(torch.bfloat16)
            assert torch.equal(ops.rms_norm(x, module.weight, module.variance_epsilon),
                               module(x))


def test_rotary_tables_are_transformers_bit_for_bit(tiny_model_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.float32)
    rotary = model.model.rotary_emb
    positions = torch.tensor([0, 1, 5, 77, 1000, 4095])
    x = torch.zeros(1, 6, model.config.hidden_size)
    for dtype in (torch.float32, torch.bfloat16):
        want_cos, want_sin = rotary(x.to(dtype), positions[None])
        cos, sin = ops.rotary_tables(positions, rotary.inv_freq,
                                     float(rotary.attention_scaling), dtype)
        assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


def test_the_rotary_table_holds_each_positions_own_values(tiny_model_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.float32)
    rotary = model.model.rotary_emb
    for dtype in (torch.float32, torch.bfloat16):
        table = ops.RotaryTable(rotary.inv_freq, float(rotary.attention_scaling), dtype)
        for positions in ([5], [0, 1, 2, 3], [300], list(range(250, 263)), [4095, 7]):
            at = torch.tensor(positions)
            cos, sin = table(at)
            want_cos, want_sin = ops.rotary_tables(at, rotary.inv_freq,
                                                   float(rotary.attention_scaling), dtype)
            assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert table.cos is not None and table.cos.shape[0] == 4096  # grown by doubling
