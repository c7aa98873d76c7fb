"""End to end on CPU in fp32: the engine's greedy tokens equal ``model.generate(do_sample=False)``.

Tiny random-weight qwen2 / llama / qwen3 models from ``langchain_ascend.testing``; block size 4
so every prompt crosses block boundaries; small ``max_tokens`` to stay fast.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM  # noqa: E402

from langchain_ascend.engine import LLMEngine, get_engine  # noqa: E402
from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402
from langchain_ascend.errors import (  # noqa: E402
    DeviceUnavailableError,
    InvalidRequestError,
    PromptTooLongError,
)

ARCHS = ("qwen2", "llama", "qwen3")
BLOCK_SIZE = 4


class Reference:
    """Plain transformers greedy decoding, memoised per (prompt, max_new_tokens)."""

    def __init__(self, path, eos_token_ids):
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.eos = set(eos_token_ids)
        self._memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def __call__(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in self._memo:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=max_new_tokens, do_sample=False)
            tokens = out[0, len(prompt):].tolist()
            for i, tok in enumerate(tokens):  # the engine returns tokens before EOS
                if tok in self.eos:
                    tokens = tokens[:i]
                    break
            self._memo[key] = tokens
        return self._memo[key]


@pytest.fixture(scope="module")
def setups(tiny_model_paths):
    """One engine of our own (not the process-wide shared one, which other test modules may
    have created with other pool sizes) and one reference model per architecture."""
    built = {}
    for arch in ARCHS:
        path = tiny_model_paths[arch]
        engine = LLMEngine(path, device="cpu", dtype="float32", block_size=BLOCK_SIZE,
                           num_blocks=256, max_num_batched_tokens=256)
        built[arch] = (engine, Reference(path, engine.eos_token_ids))
    yield built
    for engine, _ in built.values():
        engine.shutdown()


def words(engine: LLMEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "Tools: search(query), calculator(expression). Question: what is 17 * 23?",
    "A much longer prompt that spans many blocks of the paged cache, " * 3,
    "Short one",
    "Numbers 1 2 3 4 5 6 7 8 9 10 11 12",
    "你好，世界！多字节字符测试。",
    "Agents call tools; tools return observations; agents answer.",
]


@pytest.mark.parametrize("arch", ARCHS)
def test_single_request_matches_generate(setups, arch):
    engine, reference = setups[arch]
    prompt = words(engine, PROMPTS[2])
    out = engine.generate(prompt, SamplingParams(max_tokens=10))
    assert out.token_ids == reference(prompt, 10)
    assert out.text == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert out.stats.num_prompt_tokens == len(prompt)


def test_eight_concurrent_threads_match_generate(setups):
    engine, reference = setups["qwen2"]
    prompts = [words(engine, p) for p in PROMPTS]
    lengths = [4 + (i % 4) * 2 for i in range(8)]
    results: dict[int, list[int]] = {}
    steps_before = engine.stats().num_steps

    def call(i):
        results[i] = engine.generate(prompts[i], SamplingParams(max_tokens=lengths[i])).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(8):
        assert results[i] == reference(prompts[i], lengths[i]), i
    # requests were batched: far fewer steps than one per token per request
    assert engine.stats().num_steps - steps_before < sum(lengths)


async def test_eight_concurrent_asyncio_tasks_match_generate(setups):
    engine, reference = setups["llama"]
    prompts = [words(engine, p) for p in PROMPTS]
    lengths = [3 + i % 5 for i in range(8)]
    outs = await asyncio.gather(*(engine.agenerate(p, SamplingParams(max_tokens=n))
                                  for p, n in zip(prompts, lengths, strict=True)))
    for out, prompt, n in zip(outs, prompts, lengths, strict=True):
        assert out.token_ids == reference(prompt, n)


async def test_astream_matches_generate(setups):
    engine, reference = setups["qwen3"]
    prompt = words(engine, PROMPTS[1])
    deltas = [d async for d in engine.astream(prompt, SamplingParams(max_tokens=8))]
    assert [t for d in deltas for t in d.token_ids] == reference(prompt, 8)
    assert "".join(d.text for d in deltas) == deltas[-1].output.text


def test_five_hop_conversation_reuses_the_cache(setups):
    engine, reference = setups["qwen3"]
    tok = engine.tokenizer
    text = tok.apply_chat_template(
        [{"role": "system", "content": "You are a helpful agent with tools."},
         {"role": "user", "content": "Plan a trip."}],
        add_generation_prompt=True, tokenize=False)
    history = tok.encode(text)
    cached = []
    for hop in range(5):
        out = engine.generate(history, SamplingParams(max_tokens=6))
        assert out.token_ids == reference(history, 6), hop
        cached.append(out.stats.num_cached_tokens)
        history = history + out.token_ids + words(engine, f"\nobservation {hop}: ok\n")
    assert cached[0] == 0
    assert all(c > 0 for c in cached[1:]), cached
    assert cached[4] > cached[1]
    assert engine.stats().prefix_cache_hits > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_sessions_sharing_a_prompt_move_cached_blocks_and_stay_exact(setups, arch):
    """Session B reuses A's system prompt; A's cached blocks right after it are moved (their
    K/V copied) so B's blocks stay consecutive; A's next hop then hits the moved copies."""
    engine, reference = setups[arch]
    system = words(engine, PROMPTS[3])  # many full blocks
    first = system + words(engine, " Question A: what is the weather in Paris today?")
    out_a = engine.generate(first, SamplingParams(max_tokens=6))
    moved_before = engine.driver.kv.pool.num_relocations
    second = system + words(engine, " Question B: book two flights to Berlin.")
    out_b = engine.generate(second, SamplingParams(max_tokens=6))
    assert out_b.token_ids == reference(second, 6)
    assert out_b.stats.num_cached_tokens > 0
    assert engine.driver.kv.pool.num_relocations > moved_before
    history = first + out_a.token_ids + words(engine, " Observation: sunny, 21 C.")
    out_a2 = engine.generate(history, SamplingParams(max_tokens=6))
    assert out_a2.stats.num_cached_tokens > len(first) - BLOCK_SIZE
    assert out_a2.token_ids == reference(history, 6)


def test_a_caller_under_autocast_still_gets_float32_results(setups):
    """On the CPU the calling thread runs the steps: its autocast must not reach the model."""
    engine, reference = setups["qwen2"]
    prompt = words(engine, PROMPTS[5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = engine.generate(prompt, SamplingParams(max_tokens=10))
    assert out.token_ids == reference(prompt, 10)


def test_tiny_pool_forces_preemption_with_identical_outputs(tiny_model_paths, setups):
    _, reference = setups["qwen2"]
    engine = LLMEngine(tiny_model_paths["qwen2"], device="cpu", dtype="float32",
                       block_size=BLOCK_SIZE, num_blocks=14, max_num_batched_tokens=64)
    try:
        prompts = [words(engine, p) for p in (PROMPTS[0], PROMPTS[1], PROMPTS[4], PROMPTS[5])]
        # submitted together (a stream submits at once; its deltas queue up until read)
        streams = [engine.stream(p, SamplingParams(max_tokens=12)) for p in prompts]
        results = [list(stream)[-1].output for stream in streams]
        assert engine.stats().num_preemptions > 0
        for i, prompt in enumerate(prompts):
            assert results[i].token_ids == reference(prompt, 12), i
        assert engine.stats().num_blocks_used == 0
    finally:
        engine.shutdown()


def test_stop_string_spanning_tokens(setups):
    engine, _ = setups["llama"]
    prompt = words(engine, PROMPTS[3])
    full = engine.generate(prompt, SamplingParams(max_tokens=12))
    pieces = [engine.tokenizer.decode([t]) for t in full.token_ids]
    # a stop string made of the end of one token and the start of the next
    stop = next(a[-1:] + b[:2] for a, b in zip(pieces[2:], pieces[3:], strict=False)
                if a.strip() and b.strip() and "\ufffd" not in a + b
                and a[-1:] + b[:2] in full.text)
    out = engine.generate(prompt, SamplingParams(max_tokens=12, stop=[stop]))
    expected = full.text[:full.text.index(stop)]
    assert out.text == expected
    assert out.finish_reason == "stop" and out.stop_reason == stop
    streamed = list(engine.stream(prompt, SamplingParams(max_tokens=12, stop=[stop])))
    assert "".join(d.text for d in streamed) == expected


def test_seeded_sampling_is_reproducible_in_any_batch(setups):
    engine, _ = setups["qwen2"]
    prompt = words(engine, PROMPTS[1])
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=1234)
    alone = engine.generate(prompt, params).token_ids
    results = {}

    def call(i, p):
        results[i] = engine.generate(prompt if i == 0 else words(engine, PROMPTS[i]), p)

    others = [SamplingParams(max_tokens=10, temperature=1.0, seed=i) for i in range(1, 4)]
    threads = [threading.Thread(target=call, args=(i, p))
               for i, p in enumerate([params, *others])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[0].token_ids == alone
    different = engine.generate(prompt, SamplingParams(max_tokens=10, temperature=1.0, seed=99))
    assert different.token_ids != alone


def test_abort_and_stream_close_free_blocks(setups):
    engine, _ = setups["llama"]
    stream = engine.stream(words(engine, PROMPTS[3]),
                           SamplingParams(max_tokens=500, ignore_eos=True))
    next(stream)
    assert engine.stats().num_blocks_used > 0
    stream.close()
    assert engine.stats().num_blocks_used == 0


def test_bad_inputs_raise_typed_errors_then_engine_still_serves(setups, tiny_model_paths):
    engine, reference = setups["qwen2"]
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.generate([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.generate([1, 2], SamplingParams(max_tokens=0))
    with pytest.raises(PromptTooLongError):
        engine.generate([5] * (engine.max_context_length + 1), SamplingParams())
    with pytest.raises(PromptTooLongError, match="KV cache"):
        engine.generate([5] * (engine.num_blocks * engine.block_size + 1), SamplingParams())
    with pytest.raises(DeviceUnavailableError):
        LLMEngine(tiny_model_paths["qwen2"], device="tpu")
    prompt = words(engine, PROMPTS[0])
    assert engine.generate(prompt, SamplingParams(max_tokens=4)).token_ids == reference(prompt, 4)


def test_get_engine_shares_one_engine_per_model_device_dtype(setups, tiny_model_paths):
    engine = get_engine(tiny_model_paths["qwen2"], device="cpu", dtype="float32", num_blocks=64)
    assert get_engine(tiny_model_paths["qwen2"], device="cpu", dtype="float32",
                      num_blocks=64) is engine
    # No settings = the defaults: an engine of its own (num_blocks=64 is not silently shared),
    # and the same one for every such call; never the engine built outside the registry.
    default = get_engine(tiny_model_paths["qwen2"], device="cpu", dtype="float32")
    assert default is not engine and default.num_blocks != 64
    assert get_engine(tiny_model_paths["qwen2"], device="cpu", dtype="float32") is default
    assert default is not setups["qwen2"][0]
    assert engine.eos_token_ids[0] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(engine.eos_token_ids) == 2  # generation_config's list, tokenizer EOS included
