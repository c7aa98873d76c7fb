"""The CPU decoder (issue 23): one object runs a known family's pure-decode steps natively;
the runner calls it for those steps only, and a family it does not know runs the HF forward."""

from __future__ import annotations

import pytest
import torch
from _lean_steps import PROMPTS, prepared_runner
from transformers import AutoModelForCausalLM, GemmaConfig, GemmaForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu.decoder import CpuDecoder
from langchain_ascend.engine.cpu.swap import is_swapped
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing import needs_native_kernels

GREEDY = SamplingParams(max_tokens=8)


def _decoder_calls(runner, monkeypatch) -> list[int]:
    """Rows of every step the runner ran through its CPU decoder."""
    calls: list[int] = []
    decoder = runner.hooks.decoder
    hidden = decoder.hidden

    def spy(input_ids, position_ids, step):
        calls.append(input_ids.shape[1])
        return hidden(input_ids, position_ids, step)

    monkeypatch.setattr(decoder, "hidden", spy)
    return calls


def _hf_next_logits(model, ids: list[int]) -> torch.Tensor:
    """``(V,)`` next-token logits of ``ids`` from the model's own HF forward (its own cache
    and attention, nothing of ours)."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_decoder_runs_decode_steps_and_matches_the_hf_forward(tiny_model_paths, arch,
                                                              monkeypatch):
    runner = prepared_runner(tiny_model_paths[arch], torch.float32)
    decoder = runner.hooks.decoder
    assert isinstance(decoder, CpuDecoder)
    assert decoder.num_layers == runner.model.config.num_hidden_layers
    assert runner.hooks.changes["decode_stack"] == decoder.num_layers
    assert not is_swapped(runner.model.get_decoder())  # reached by the runner, not a swap
    calls = _decoder_calls(runner, monkeypatch)
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    runner.forward_batch([ScheduledSegment(f"r{i}", p, 0, tables[i], True, GREEDY)
                          for i, p in enumerate(PROMPTS)])
    assert calls == []  # a prefill: the HF forward
    news = [7, 8, 9]
    got = runner.forward_batch([ScheduledSegment(f"r{i}", [news[i]], len(p), tables[i], True,
                                                 GREEDY) for i, p in enumerate(PROMPTS)])[1]
    assert calls == [3]  # the pure-decode step: the decoder, once
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)
    want = torch.stack([_hf_next_logits(reference, p + [news[i]])
                        for i, p in enumerate(PROMPTS)])  # (3, V)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@needs_native_kernels()
def test_runner_calls_the_decoder_only_for_pure_decode_steps(tiny_model_paths, monkeypatch):
    runner = prepared_runner(tiny_model_paths["llama"], torch.float32)
    calls = _decoder_calls(runner, monkeypatch)
    runner.forward_batch([ScheduledSegment("a", [1, 2, 3, 4, 5], 0, [0, 1], True, GREEDY)])
    runner.forward_batch([ScheduledSegment("a", [6], 5, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [7, 8, 9], 0, [2], True, GREEDY)])
    assert calls == []  # a prefill, then a mixed step
    runner.forward_batch([ScheduledSegment("a", [10], 6, [0, 1], True, GREEDY),
                          ScheduledSegment("b", [11], 3, [2], True, GREEDY)])
    assert calls == [2]
    # a verify pass (one known token, two drafts) is packed as decode rows: the decoder
    verify = ScheduledSegment("a", [12, 13, 14], 7, [0, 1, 3], True, GREEDY,
                              draft_token_ids=[13, 14])
    runner.forward_batch([verify])
    assert calls == [2, 3]
    # more rows than the decoder takes: the HF forward
    runner.hooks.decoder.stack.max_rows = 1
    runner.forward_batch([ScheduledSegment("a", [15], 10, [0, 1, 3], True, GREEDY),
                          ScheduledSegment("b", [16], 4, [2, 4], True, GREEDY)])
    assert calls == [2, 3]


@needs_native_kernels()
def test_no_decoder_without_every_layer_prepared(tiny_model_paths):
    runner = prepared_runner(tiny_model_paths["qwen2"], torch.float32)
    layers = list(runner.model.get_decoder().layers)
    assert CpuDecoder.build(runner.model, layers) is not None
    assert CpuDecoder.build(runner.model, layers[:-1]) is None  # one layer not lean
    row = prepared_runner(tiny_model_paths["qwen2"], torch.float32, weight_layout_name="row")
    assert row.hooks.decoder is None and row.hooks.changes["decode_stack"] == 0


def _tiny_gemma() -> GemmaForCausalLM:
    """A family the decoder does not know (Gemma: scaled embeddings, ``1 + weight`` norms)."""
    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=128)
    return GemmaForCausalLM(config).eval()


@pytest.mark.parametrize("quantized", [False, True])
def test_an_unknown_family_gets_no_decoder_and_runs_the_hf_forward(quantized):
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
    assert runner.hooks.decoder is None and runner.hooks.changes["decode_stack"] == 0
    runner.forward_batch([ScheduledSegment("a", prompt, 0, [0, 1], True, GREEDY)])
    got = runner.forward_batch([ScheduledSegment("a", [7], 5, [0, 1], True, GREEDY)])[1]
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)
