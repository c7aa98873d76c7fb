"""The engine on a GGUF file's own blocks: the weightless cache folder, the ``quantization``
setting of ModelRunner / LLMEngine, and ``stats().weights``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_gguf

from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.engine.model_source import gguf_weights_file, resolve_model_source
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.errors import ModelSourceError
from langchain_ascend.quant.gguf_model import load_gguf_model
from langchain_ascend.quant.linear import QuantizedLinear
from langchain_ascend.quant.load import resolve_quantization
from langchain_ascend.testing import build_model


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(build_model("tiny", "llama"), tmp_path_factory.mktemp("gguf") / "m.gguf")


@pytest.fixture(scope="module")
def folder(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    return resolve_model_source(gguf_path, quantization="gguf", cache_dir=cache,
                                progress=False).path


def _engine(path: Path, **kwargs: object) -> LLMEngine:
    return LLMEngine(path, device="cpu", dtype="float32", num_blocks=32, block_size=16,
                     max_num_batched_tokens=128, **kwargs)  # type: ignore[arg-type]


def test_resolve_writes_a_weightless_folder_once(gguf_path: Path, folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "source.json"} <= names
    assert not any(name.endswith((".safetensors", ".bin")) for name in names)
    assert gguf_weights_file(folder) == gguf_path.resolve()
    source = json.loads((folder / "source.json").read_text())
    again = resolve_model_source(gguf_path, quantization="int8",
                                 cache_dir=folder.parent.parent, progress=False)
    assert again.path == folder and again.kind == "gguf" and source["weights"] == "gguf"


def test_a_moved_gguf_file_is_named(tmp_path: Path, folder: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    source = json.loads((folder / "source.json").read_text())
    source["gguf_file"] = str(tmp_path / "gone.gguf")
    (copy / "source.json").write_text(json.dumps(source))
    with pytest.raises(ModelSourceError, match="no longer exists"):
        gguf_weights_file(copy)
    assert gguf_weights_file(tmp_path) is None


def test_resolve_quantization() -> None:
    assert resolve_quantization("auto", from_gguf=True) == "gguf"
    assert resolve_quantization("auto", from_gguf=False) == "none"
    assert resolve_quantization(None, from_gguf=True) == "none"
    assert resolve_quantization("int4", from_gguf=False) == "int4"
    with pytest.raises(ValueError, match="GGUF"):
        resolve_quantization("gguf", from_gguf=False)
    with pytest.raises(ValueError, match="quantization"):
        resolve_quantization("fp8", from_gguf=True)


def test_engine_runs_the_blocks_and_says_so(folder: Path, gguf_path: Path) -> None:
    # A float32 KV cache: the logits below are compared with the float model's own forward
    # (the default float16 cache of quantized weights is test_kv_cache_dtype.py's).
    engine = _engine(folder, kv_cache_dtype="float32")
    try:
        weights = engine.stats().weights
        assert weights["quantization"] == "gguf" and weights["format"] == "q4_1+q8_0"
        assert weights["linear_formats"] == {"q4_1": 14, "q8_0": 1}
        assert 0 < weights["quantized_bytes"] <= weights["bytes"]
        prompt = engine.tokenizer.encode("The quick brown fox")
        out = engine.generate(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
        assert len(out.token_ids) == 6
        # The runner's packed step gives the logits of the model built from the same file.
        runner = engine.driver.runner
        assert sum(isinstance(m, QuantizedLinear) for m in runner.model.modules()) >= 14
        model, _ = load_gguf_model(gguf_path)
        with torch.inference_mode():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        from langchain_ascend.engine.core.batch import ScheduledSegment

        segment = ScheduledSegment("probe", prompt, 0, [0], True, SamplingParams(max_tokens=1))
        _, logits = runner.forward_batch([segment])
        # Both run the same int8-activation products, but their float ops (attention, RoPE)
        # round differently per CPU, and a difference that flips one activation's int8 rounding
        # moves a product by ~1/127 of a block: agreement within the activations' quantization
        # error (1e-3 held on AMD Zen 4, not on an Intel Xeon: 0.008 of 0.79), same top tokens.
        torch.testing.assert_close(logits[0], expected, rtol=0,
                                   atol=0.02 * float(expected.abs().max()))
        assert logits[0].topk(5).indices.tolist() == expected.topk(5).indices.tolist()
    finally:
        engine.shutdown()


def test_none_mode_on_a_gguf_folder_is_float(folder: Path) -> None:
    runner = ModelRunner.load(str(folder), device="cpu", dtype="float32", num_blocks=8,
                              block_size=16, quantization="none", compile=False)
    assert runner.weights["quantization"] == "none" and runner.weights["quantized_bytes"] == 0
    assert not any(isinstance(m, QuantizedLinear) for m in runner.model.modules())


@pytest.mark.parametrize(("mode", "fmt"), [("int8", "q8_0"), ("int4", "q4_1")])
def test_int8_int4_on_an_hf_folder(mode: str, fmt: str) -> None:
    engine = _engine(build_model("tiny", "qwen2"), quantization=mode)  # tied head
    try:
        weights = engine.stats().weights
        assert weights["quantization"] == mode and weights["format"] == fmt
        assert weights["linear_formats"] == {fmt: 15}
        out = engine.generate(engine.tokenizer.encode("Hello there"),
                              SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(out.token_ids) == 4
    finally:
        engine.shutdown()


def test_quantize_model_shares_a_tied_table() -> None:
    from transformers import AutoModelForCausalLM

    from langchain_ascend.quant.embedding import QuantizedEmbedding
    from langchain_ascend.quant.quantize_model import quantize_model, weight_summary

    path = build_model("tiny", "qwen2")  # tied head
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 2, 3, 400]])
    with torch.inference_mode():
        expected = model(ids).logits
    assert len(quantize_model(model, "q8_0")) == 15
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(head, QuantizedLinear)
    assert embedding.blocks is head.blocks
    summary = weight_summary(model)
    assert summary["linear_formats"] == {"q8_0": 15}
    assert summary["quantized_bytes"] == sum(
        m.weight_bytes for m in model.modules() if isinstance(m, QuantizedLinear)
        and m is not head) + head.weight_bytes
    with torch.inference_mode():
        logits = model(ids).logits
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()


def test_gguf_mode_needs_a_gguf_model() -> None:
    with pytest.raises(ValueError, match="GGUF"):
        _engine(build_model("tiny", "qwen2"), quantization="gguf")


def test_float_engine_reports_its_weights() -> None:
    engine = _engine(build_model("tiny", "qwen2"))
    try:
        weights = engine.stats().weights
        assert weights["quantization"] == "none" and weights["format"] == "float32"
        assert weights["quantized_bytes"] == 0 and weights["bytes"] > 0
    finally:
        engine.shutdown()
