"""A GGUF file mixing K-quants as a Q4_K_M file does (Q4_K, Q6_K for some attn_v / ffn_down and
the head, a Q5_0 and a Q8_0 tensor) runs from its own blocks: no re-quantization, the same
logits as transformers' de-quantizing loader, greedy decode equal to the de-quantized model;
Q2_K / Q3_K still re-quantize."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_fixtures import write_gguf

from langchain_ascend.quant.gguf_file import GGUFFile
from langchain_ascend.quant.gguf_model import load_gguf_model, rotary_row_order
from langchain_ascend.quant.linear import QuantizedLinear, use_reference
from langchain_ascend.testing import build_model, needs_native_kernels

IDS = torch.tensor([[5, 17, 300, 4000, 2, 99, 1024, 7]])
Q4_K_M_TYPES = {"blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K",
                "blk.1.attn_k.weight": "Q5_0", "blk.1.ffn_up.weight": "Q8_0",
                "output.weight": "Q6_K"}
"""Per-tensor types over Q4_K linears and a Q4_K embedding, as llama-quantize's Q4_K_M mixes."""


def _wide_llama(root: Path) -> Path:
    """The tiny Llama's tokenizer with a 256-wide model (K-quant rows are 256 values)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tiny = build_model("tiny", "llama")
    folder = root / "llama-256"
    shutil.copytree(tiny, folder)
    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.intermediate_size = 256, 512
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 8, 4, 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kquants")
    folder = _wide_llama(root)
    return {
        "q4_k_m": write_gguf(folder, root / "q4_k_m.gguf", linear_type="Q4_K",
                             embed_type="Q4_K", tie=False, types=Q4_K_M_TYPES),
        "q5_k": write_gguf(folder, root / "q5_k.gguf", linear_type="Q5_K", embed_type="Q8_0",
                           tie=False, types={"blk.0.attn_q.weight": "Q5_1"}),
        "low_bits": write_gguf(folder, root / "low.gguf", linear_type="Q4_K", embed_type="Q8_0",
                               tie=False, types={"blk.0.ffn_gate.weight": "Q3_K",
                                                 "blk.1.attn_output.weight": "Q2_K"}),
    }


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits[0]  # (T, V)


def test_a_q4_k_m_file_runs_its_own_blocks(files: dict[str, Path]) -> None:
    model, report = load_gguf_model(files["q4_k_m"])
    layers = model.model.layers
    assert report.requantized == []
    assert layers[0].self_attn.v_proj.fmt == "q6_k" and layers[0].mlp.down_proj.fmt == "q6_k"
    assert layers[1].self_attn.k_proj.fmt == "q5_0" and layers[1].mlp.up_proj.fmt == "q8_0"
    assert layers[1].mlp.down_proj.fmt == "q4_k" and model.lm_head.fmt == "q6_k"
    assert model.model.embed_tokens.fmt == "q4_k"
    gguf = GGUFFile(files["q4_k_m"])
    down = layers[0].mlp.down_proj
    assert np.array_equal(down.blocks.numpy(), np.asarray(gguf.raw("blk.0.ffn_down.weight")))
    q_proj = layers[1].self_attn.q_proj
    order = rotary_row_order(q_proj.out_features, model.config.num_attention_heads)
    assert np.array_equal(q_proj.blocks.numpy(), np.asarray(gguf.raw("blk.1.attn_q.weight"))[order])
    assert dict(report.formats) == {"q4_k": 10, "q6_k": 3, "q5_0": 1, "q8_0": 1}


@pytest.mark.parametrize("name", ["q4_k_m", "q5_k"])
def test_logits_match_transformers_gguf_loader(files: dict[str, Path], name: str) -> None:
    """transformers de-quantizes every type with gguf-py: the weights-only reference product
    on our blocks gives its logits."""
    from transformers import AutoModelForCausalLM

    path = files[name]
    model, _ = load_gguf_model(path)
    assert use_reference(model) > 0
    expected = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                    dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(model), _logits(expected), rtol=1e-4, atol=1e-4)


def test_q2_k_and_q3_k_still_requantize_and_say_so(files: dict[str, Path]) -> None:
    model, report = load_gguf_model(files["low_bits"])
    layers = model.model.layers
    assert layers[0].mlp.gate_proj.fmt == "q4_1" and layers[1].self_attn.o_proj.fmt == "q4_1"
    assert layers[0].mlp.up_proj.fmt == "q4_k"
    q5, _ = load_gguf_model(files["q5_k"])
    assert q5.model.layers[0].self_attn.q_proj.fmt == "q5_1"
    assert q5.model.layers[0].mlp.up_proj.fmt == "q5_k"
    assert sorted(r[:2] for r in report.requantized) == [
        ("blk.0.ffn_gate.weight", "Q3_K"), ("blk.1.attn_output.weight", "Q2_K")]


@needs_native_kernels()
def test_native_products_are_close_to_the_dequantized_model(files: dict[str, Path]) -> None:
    model, _ = load_gguf_model(files["q4_k_m"])
    use_reference(model, reference=False)
    native = _logits(model)
    use_reference(model)
    reference = _logits(model)
    # Only the activations' int8 rounding (per block of 32) differs.
    assert (native - reference).norm() / reference.norm() < 0.02


@needs_native_kernels()
def test_engine_greedy_decode_equals_the_dequantized_model(files: dict[str, Path]) -> None:
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.engine.model_source import resolve_model_source

    path = files["q4_k_m"]
    folder = resolve_model_source(path, quantization="gguf", cache_dir=path.parent / "cache",
                                  progress=False).path
    engine = LLMEngine(folder, device="cpu", dtype="float32", num_blocks=32, block_size=16,
                       max_num_batched_tokens=128, kv_cache_dtype="float32")
    try:
        runner = engine.driver.runner
        formats = {m.fmt for m in runner.model.modules() if isinstance(m, QuantizedLinear)}
        assert {"q4_k", "q6_k", "q5_0", "q8_0"} <= formats
        layouts = {(m.fmt, m.layout) for m in runner.model.modules()
                   if isinstance(m, QuantizedLinear)}
        assert {("q4_k", "x8"), ("q6_k", "x8")} <= layouts  # re-laid at load, parts included
        # Both layers run in the native stack, their q/k/v (Q4_K with a Q6_K or Q5_0 member)
        # as one product in parts.
        assert runner.hooks.changes["owned_layers"] == 2
        prompt = [5, 17, 300, 4000, 2, 99]
        out = engine.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))

        async def together() -> list:
            params = SamplingParams(max_tokens=8, ignore_eos=True)
            return await asyncio.gather(engine.agenerate(prompt, params),
                                        engine.agenerate(prompt[:3], params))

        batched = asyncio.run(together())
    finally:
        engine.shutdown()
    model, _ = load_gguf_model(path)
    use_reference(model)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(8):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(out.token_ids) == ids[len(prompt):]
    assert list(batched[0].token_ids) == list(out.token_ids)


Q4_K_M_FILE_ENV = "LANGCHAIN_ASCEND_Q4_K_M_GGUF"
"""A real Q4_K_M GGUF file to check (e.g. SmolLM2 re-quantized by llama-quantize: its 576-wide
rows fall back to Q5_0 / Q8_0, its 1536-wide ffn_down take Q4_K / Q6_K); skipped when unset."""


@needs_native_kernels()
def test_a_real_q4_k_m_file_if_one_is_named() -> None:
    import os

    path = os.environ.get(Q4_K_M_FILE_ENV)
    if not path or not Path(path).is_file():
        pytest.skip(f"set {Q4_K_M_FILE_ENV} to a Q4_K_M GGUF file")
    model, report = load_gguf_model(path)
    assert report.requantized == []
    assert {"q4_k", "q6_k"} <= set(report.formats)
    ids = torch.tensor([[1, 504, 2365, 5709, 282, 253, 3158, 28, 5376, 314, 6335, 30]])
    with torch.inference_mode():
        native = model(ids).logits[0]
        use_reference(model)
        reference = model(ids).logits[0]
    # the int8 activations of every product, over all layers: as for the Q4_1 file (~5%)
    assert (native - reference).norm() / reference.norm() < 0.1
    assert torch.equal(native.argmax(-1), reference.argmax(-1))


@needs_native_kernels()
def test_bf16_engine_runs_the_parts_and_batches_invariantly(files: dict[str, Path]) -> None:
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.engine.model_source import resolve_model_source

    path = files["q4_k_m"]
    folder = resolve_model_source(path, quantization="gguf", cache_dir=path.parent / "cache",
                                  progress=False).path
    engine = LLMEngine(folder, device="cpu", dtype="bfloat16", num_blocks=32, block_size=16,
                       max_num_batched_tokens=128)
    try:
        assert engine.driver.runner.hooks.changes["owned_layers"] == 2
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        prompt = [5, 17, 300, 4000, 2, 99]
        solo = engine.generate(prompt, params)

        async def together() -> list:
            return await asyncio.gather(engine.agenerate([7, 8, 9, 10], params),
                                        engine.agenerate(prompt, params))

        batched = asyncio.run(together())
    finally:
        engine.shutdown()
    assert list(batched[1].token_ids) == list(solo.token_ids)
