"""``kv_cache_dtype``: a float16 KV cache under float32 quantized weights on the CPU (the
"auto" choice), what it stores, and that a request's text still depends on nothing but itself:
solo or batched, cold or over a cached prefix."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_gguf

from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.engine.model_source import resolve_model_source
from langchain_ascend.engine.worker.kv_cache import resolve_kv_cache_dtype
from langchain_ascend.native import paged_attention
from langchain_ascend.testing import build_model

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not paged_attention.available(torch.float32, torch.float16),
                                reason="the native paged kernel is not built on this host")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gguf = write_gguf(build_model("tiny", "llama"), tmp_path_factory.mktemp("gguf") / "m.gguf")
    return resolve_model_source(gguf, quantization="gguf",
                                cache_dir=tmp_path_factory.mktemp("cache"), progress=False).path


def _engine(path: Path, **kwargs: object) -> LLMEngine:
    return LLMEngine(path, device="cpu", dtype="float32", num_blocks=64, block_size=16,
                     max_num_batched_tokens=256, **kwargs)  # type: ignore[arg-type]


def test_auto_is_float16_only_for_quantized_float32_weights_on_the_cpu() -> None:
    f32, bf16 = torch.float32, torch.bfloat16
    assert resolve_kv_cache_dtype("auto", device=CPU, dtype=f32, quantized=True) == torch.float16
    assert resolve_kv_cache_dtype(None, device=CPU, dtype=f32, quantized=True) == torch.float16
    assert resolve_kv_cache_dtype("auto", device=CPU, dtype=f32, quantized=False) == f32
    assert resolve_kv_cache_dtype("auto", device=CPU, dtype=bf16, quantized=True) == bf16
    assert resolve_kv_cache_dtype("auto", device=torch.device("cuda"), dtype=f32,
                                  quantized=True) == f32
    assert resolve_kv_cache_dtype("float32", device=CPU, dtype=f32, quantized=True) == f32
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        resolve_kv_cache_dtype("int8", device=CPU, dtype=f32, quantized=True)


def test_a_backend_without_a_reader_refuses_another_cache_dtype() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype=float16 is not supported"):
        TorchRefBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                        device=CPU, cache_dtype=torch.float16)


def _texts(engine: LLMEngine, prompts: list[list[int]], batched: bool) -> list[list[int]]:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    if not batched:
        return [engine.generate(p, params).token_ids for p in prompts]
    results: list[list[int]] = [[] for _ in prompts]

    def run(i: int) -> None:
        results[i] = engine.generate(prompts[i], params).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_gguf_weights_store_float16_keys_and_values_and_stay_exact(folder: Path) -> None:
    engine = _engine(folder)
    try:
        assert engine.stats().weights["kv_cache_dtype"] == "float16"
        assert {t.dtype for t in engine.driver.runner.kv_cache.tensors} == {torch.float16}
        shared = engine.tokenizer.encode("The agent's shared system prompt, " * 4)
        prompts = [shared + engine.tokenizer.encode(tail)
                   for tail in (" first question", " a second, longer question", " third")]
        solo = _texts(engine, prompts, batched=False)  # the later ones over a cached prefix
        engine.reset_prefix_cache()
        cold = [_texts(engine, [p], batched=False)[0] for p in prompts[:1]]
        batched = _texts(engine, prompts, batched=True)
        assert cold[0] == solo[0]
        assert batched == solo
        assert all(len(t) == 12 for t in solo)
    finally:
        engine.shutdown()


def test_float32_can_still_be_asked_for(folder: Path) -> None:
    engine = _engine(folder, kv_cache_dtype="float32")
    try:
        assert engine.stats().weights["kv_cache_dtype"] == "float32"
        assert {t.dtype for t in engine.driver.runner.kv_cache.tensors} == {torch.float32}
    finally:
        engine.shutdown()


def test_a_float_model_keeps_its_own_dtype_unless_asked() -> None:
    path = build_model("tiny", "qwen2")
    for setting, expected in (("auto", "float32"), ("float16", "float16")):
        engine = _engine(path, kv_cache_dtype=setting)
        try:
            assert engine.stats().weights["kv_cache_dtype"] == expected
            out = engine.generate(engine.tokenizer.encode("Hello there"),
                                  SamplingParams(max_tokens=4, ignore_eos=True))
            assert len(out.token_ids) == 4
        finally:
            engine.shutdown()
