"""The lean decoder-layer forward: the prepared pieces called directly, the same values."""

from __future__ import annotations

import pytest
import torch
from _lean_steps import PROMPTS, mixed_step_logits, prepared_runner
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.cpu import lean_layer as lean_module
from langchain_ascend.engine.cpu import prepare
from langchain_ascend.engine.cpu.swap import swapped_by
from langchain_ascend.engine.worker.hooks import HookOptions
from langchain_ascend.testing import needs_native_kernels
from langchain_ascend.testing.runner_steps import greedy_decode

pytestmark = needs_native_kernels()


def _layers(runner):
    return [m for m in runner.model.modules() if type(m).__name__.endswith("DecoderLayer")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_lean_layers_give_identical_logits_and_tokens(tiny_model_paths, arch, dtype):
    lean = prepared_runner(tiny_model_paths[arch], dtype)
    plain = prepared_runner(tiny_model_paths[arch], dtype, without=[(lean_module, "lean_layers", [])])
    layers = _layers(lean)
    assert layers and all(swapped_by(m) == "lean_layer" for m in layers)
    assert lean.hooks.changes["lean_layers"] == len(layers)
    assert plain.hooks.changes["lean_layers"] == 0
    assert not any(swapped_by(m) == "lean_layer" for m in _layers(plain))
    tokens = {name: greedy_decode(r, PROMPTS, 6, blocks_per_request=6)
              for name, r in (("lean", lean), ("plain", plain))}
    assert tokens["lean"] == tokens["plain"]
    logits = {name: mixed_step_logits(r) for name, r in (("lean", lean), ("plain", plain))}
    assert torch.equal(logits["lean"], logits["plain"])  # the same ops in the same order


def test_layers_without_fused_products_keep_their_forward(tiny_model_paths):
    runner = prepared_runner(tiny_model_paths["llama"], torch.float32,
                             weight_layout_name="row")  # no fused groups
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
