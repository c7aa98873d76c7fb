"""The lean decoder-layer forward: the prepared pieces called directly, the same values."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.cpu import lean_layer as lean_module
from langchain_ascend.engine.cpu import prepare
from langchain_ascend.engine.cpu.swap import swapped_by
from langchain_ascend.engine.cpu.weight_layout import dual_linears
from langchain_ascend.engine.worker.hooks import HookOptions
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.testing import needs_native_kernels
from langchain_ascend.testing.runner_steps import greedy_decode

pytestmark = needs_native_kernels()


def _runner(path, dtype, *, lean, monkeypatch, weight_layout="auto"):
    if not lean:
        monkeypatch.setattr(lean_module, "lean_layers", lambda model: 0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    runner = ModelRunner.from_model(model, num_blocks=64, block_size=4, compile=False,
                                    weight_layout=weight_layout)
    monkeypatch.undo()
    for linear in dual_linears(runner.model):  # one product choice for both runners (the
        linear.native_max_rows = 64  # measured one may differ between them), fused groups too
    return runner


def _layers(runner):
    return [m for m in runner.model.modules() if type(m).__name__.endswith("DecoderLayer")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_lean_layers_give_identical_logits_and_tokens(tiny_model_paths, arch, dtype,
                                                      monkeypatch):
    lean = _runner(tiny_model_paths[arch], dtype, lean=True, monkeypatch=monkeypatch)
    plain = _runner(tiny_model_paths[arch], dtype, lean=False, monkeypatch=monkeypatch)
    layers = _layers(lean)
    assert layers and all(swapped_by(m) == "lean_layer" for m in layers)
    assert lean.hooks.changes["lean_layers"] == len(layers)
    assert plain.hooks.changes["lean_layers"] == 0
    assert not any(swapped_by(m) == "lean_layer" for m in _layers(plain))
    prompts = [[5, 17, 300, 41, 9, 2, 77], [8, 8, 100], [3] * 13]
    tokens = {name: greedy_decode(r, prompts, 6, blocks_per_request=6)
              for name, r in (("lean", lean), ("plain", plain))}
    assert tokens["lean"] == tokens["plain"]
    # A mixed step: two decodes, a chunk after a cached prefix, a fresh prompt.
    greedy = SamplingParams(max_tokens=4)
    prefill = [ScheduledSegment("a", list(range(1, 10)), 0, [0, 1, 2], True, greedy),
               ScheduledSegment("b", list(range(20, 26)), 0, [3, 4], True, greedy)]
    step = [ScheduledSegment("a", [11], 9, [0, 1, 2], True, greedy),
            ScheduledSegment("b", [30], 6, [3, 4], True, greedy),
            ScheduledSegment("c", [40, 41, 42, 43], 8, [0, 1, 5], True, greedy),
            ScheduledSegment("d", [7, 6, 5], 0, [6], True, greedy)]
    logits = {}
    for name, runner in (("lean", lean), ("plain", plain)):
        runner.forward_batch(prefill)
        logits[name] = runner.forward_batch(step)[1]
    assert torch.equal(logits["lean"], logits["plain"])  # the same ops in the same order


def test_layers_without_fused_products_keep_their_forward(tiny_model_paths, monkeypatch):
    runner = _runner(tiny_model_paths["llama"], torch.float32, lean=True,
                     monkeypatch=monkeypatch, weight_layout="row")  # no fused groups
    assert runner.hooks.changes["lean_layers"] == 0
    assert not any(swapped_by(m) == "lean_layer" for m in _layers(runner))


def test_plain_transformers_calls_keep_the_class_forward(tiny_model_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.float32)
    ids = torch.tensor([[5, 17, 300, 41, 9]])
    with torch.inference_mode():
        before = model(ids).logits
        hooks = prepare(model, device=torch.device("cpu"), dtype=torch.float32,
                        options=HookOptions())
        assert hooks.changes["lean_layers"] == model.config.num_hidden_layers
        after = model(ids).logits  # no paged step: the class forwards run
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
