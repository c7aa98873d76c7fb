"""Speculative decoding end to end on CPU: greedy tokens identical with drafting on or off.

Tiny random qwen2 / llama / qwen3 models (their greedy output loops, so prompt lookup finds
drafts that are sometimes right and sometimes wrong: both paths are exercised), block size 4
so drafts cross block boundaries. Single requests, concurrent mixed batches (rows with and
without drafts in one step), multi-hop prefix reuse, preemption, stop strings and sampled rows.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("torch")

from langchain_ascend.engine import LLMEngine  # noqa: E402
from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402

ARCHS = ("qwen2", "llama", "qwen3")
PROMPTS = [
    "Numbers 1 2 3 4 5 6 7 8 9 10 11 12 1 2 3 4 5 6",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "A much longer prompt that spans many blocks of the paged cache, " * 3,
    "Tools: search(query), calculator(expression). Question: what is 17 * 23?",
    "Agents call tools; tools return observations; agents answer. Agents call",
]


@pytest.fixture(scope="module")
def engines(tiny_model_paths):
    built = {arch: LLMEngine(tiny_model_paths[arch], device="cpu", dtype="float32",
                             block_size=4, num_blocks=512, max_num_batched_tokens=256)
             for arch in ARCHS}
    yield built
    for engine in built.values():
        engine.shutdown()


def greedy(mode: str, max_tokens: int = 40, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, speculation=mode, **extra)


def ids(engine, text):
    return engine.tokenizer.encode(text)


@pytest.mark.parametrize("arch", ARCHS)
def test_single_requests_identical_on_and_off(engines, arch):
    engine = engines[arch]
    drafted = accepted = 0
    for text in PROMPTS:
        prompt = ids(engine, text)
        off = engine.generate(prompt, greedy("off"))
        for mode in ("prompt_lookup", "auto"):
            on = engine.generate(prompt, greedy(mode))
            assert on.token_ids == off.token_ids, (mode, text)
            assert on.text == off.text
            assert on.finish_reason == off.finish_reason
            drafted += on.stats.num_draft_tokens
            accepted += on.stats.num_accepted_tokens
            assert on.stats.num_forward_passes <= off.stats.num_forward_passes
        assert off.stats.num_draft_tokens == 0
        # one pass per generated token (a hidden final EOS included)
        assert off.stats.num_forward_passes == off.stats.num_generated_tokens
    assert drafted > 0 and accepted > 0  # both the accept and the reject path ran
    assert accepted < drafted


def test_concurrent_mixed_rows_identical(engines):
    engine = engines["qwen2"]
    prompts = [ids(engine, p) for p in PROMPTS] * 2
    expected = [engine.generate(p, greedy("off", 24 + i)).token_ids
                for i, p in enumerate(prompts)]
    modes = ["prompt_lookup", "off", "auto"]
    results: dict[int, list[int]] = {}

    def call(i):
        results[i] = engine.generate(prompts[i], greedy(modes[i % 3], 24 + i)).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results[i] for i in range(len(prompts))] == expected
    stats = engine.stats()
    assert stats.num_draft_tokens >= stats.num_accepted_tokens > 0
    assert stats.num_blocks_used == 0  # every block came back, rollbacks included


def test_multi_hop_prefix_reuse_identical(engines):
    engine = engines["llama"]
    history = ids(engine, PROMPTS[4])
    for hop in range(3):
        off = engine.generate(history, greedy("off", 16))
        on = engine.generate(history, greedy("prompt_lookup", 16))
        assert on.token_ids == off.token_ids
        assert on.stats.num_cached_tokens >= (len(history) // 4 - 1) * 4  # the hop before
        history = history + on.token_ids + ids(engine, f" observation {hop}: ok.")


def test_preemption_with_drafts_identical(tiny_model_paths):
    # 24 blocks of 4 slots: eight 60-token requests cannot all stay resident
    engine = LLMEngine(tiny_model_paths["qwen3"], device="cpu", dtype="float32", block_size=4,
                       num_blocks=24, max_num_batched_tokens=64, max_context_length=80)
    try:
        prompts = [ids(engine, PROMPTS[i % len(PROMPTS)])[:20] for i in range(8)]
        expected = [engine.generate(p, greedy("off", 40)).token_ids for p in prompts]
        results: dict[int, list[int]] = {}

        def call(i):
            results[i] = engine.generate(prompts[i], greedy("prompt_lookup", 40)).token_ids

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [results[i] for i in range(8)] == expected
        stats = engine.stats()
        assert stats.num_preemptions > 0 and stats.num_draft_tokens > 0
        assert stats.num_blocks_used == 0
    finally:
        engine.shutdown()


def test_stop_string_inside_a_multi_token_step(engines):
    engine = engines["qwen2"]
    prompt = ids(engine, PROMPTS[0])
    plain = engine.generate(prompt, greedy("off", 40, ignore_eos=True))
    text = plain.text
    # the shortest piece of the reply's second half that first occurs there
    stop = next((text[i:i + n] for n in range(2, 12) for i in range(len(text) // 2, len(text) - n)
                 if text.find(text[i:i + n]) >= len(text) // 2 and text[i:i + n].strip()), None)
    assert stop is not None, text
    off = engine.generate(prompt, greedy("off", 40, ignore_eos=True, stop=[stop]))
    on = engine.generate(prompt, greedy("prompt_lookup", 40, ignore_eos=True, stop=[stop]))
    assert off.stop_reason == stop and on.stop_reason == stop
    assert (on.text, on.token_ids) == (off.text, off.token_ids)
    assert on.stats.num_accepted_tokens > 0  # drafts were accepted around the stop


def test_sampled_rows_do_not_draft(engines):
    engine = engines["qwen2"]
    prompt = ids(engine, PROMPTS[1])
    sampled = dict(temperature=0.8, seed=11)
    off = engine.generate(prompt, greedy("off", 24, **sampled))
    on = engine.generate(prompt, greedy("prompt_lookup", 24, **sampled))
    assert on.token_ids == off.token_ids
    assert on.stats.num_draft_tokens == 0


def test_stream_deltas_carry_the_accepted_tokens(engines):
    engine = engines["qwen3"]
    prompt = ids(engine, PROMPTS[2])
    off = engine.generate(prompt, greedy("off", 32, ignore_eos=True))
    deltas = list(engine.stream(prompt, greedy("prompt_lookup", 32, ignore_eos=True)))
    assert [t for d in deltas for t in d.token_ids] == off.token_ids
    assert "".join(d.text for d in deltas) == off.text
    stats = deltas[-1].output.stats
    assert len(deltas) == stats.num_forward_passes  # one delta per pass, several tokens each
    assert stats.num_forward_passes == 32 - stats.num_accepted_tokens


def test_auto_drafts_in_float32_only(tiny_model_paths):
    engine = LLMEngine(tiny_model_paths["qwen2"], device="cpu", dtype="bfloat16", block_size=4,
                       num_blocks=128)
    try:
        prompt = ids(engine, PROMPTS[0])
        auto = engine.generate(prompt, greedy("auto", 24, ignore_eos=True))
        lookup = engine.generate(prompt, greedy("prompt_lookup", 24, ignore_eos=True))
        assert auto.stats.num_draft_tokens == 0
        assert lookup.stats.num_draft_tokens > 0
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def quantized_engine():
    """A tiny llama with q4_1 weights (``quantization="int4"``: int8 activations per row)."""
    from langchain_ascend.testing import build_model

    engine = LLMEngine(build_model("tiny", "llama"), device="cpu", dtype="float32",
                       num_blocks=128, block_size=16, quantization="int4")
    yield engine
    engine.shutdown()


def test_auto_drafts_with_quantized_weights_and_gives_the_off_tokens(quantized_engine):
    """Issue 23: a verify pass's rows run as the one-row decodes they replace, so int8
    activations see the same values and "auto" drafts on quantized weights token-identically."""
    engine = quantized_engine
    drafted = accepted = saved = 0
    for text in PROMPTS:
        prompt = engine.tokenizer.encode(text)
        off = engine.generate(prompt, greedy("off", 48, ignore_eos=True))
        auto = engine.generate(prompt, greedy("auto", 48, ignore_eos=True))
        assert auto.token_ids == off.token_ids, text
        drafted += auto.stats.num_draft_tokens
        accepted += auto.stats.num_accepted_tokens
        saved += off.stats.num_forward_passes - auto.stats.num_forward_passes
    assert drafted > accepted > 0 and saved == accepted  # accept and reject paths both ran


def test_quantized_batch_sharing_a_prefix_gives_the_solo_tokens(quantized_engine):
    """Three requests on one cached system prefix decode together (the paged kernel reads the
    shared blocks once for all rows) and each gets its solo tokens, drafting or not."""
    engine = quantized_engine
    system = "You are a helpful assistant that answers briefly and calls tools. " * 3
    prompts = [engine.tokenizer.encode(system + text) for text in PROMPTS[:3]]
    solo = [engine.generate(p, greedy("off", 40, ignore_eos=True)).token_ids for p in prompts]
    for mode in ("off", "auto"):
        results: dict[int, Any] = {}
        barrier = threading.Barrier(len(prompts))

        def call(i, mode=mode, results=results, barrier=barrier):
            barrier.wait(30)
            results[i] = engine.generate(prompts[i], greedy(mode, 40, ignore_eos=True))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert [results[i].token_ids for i in range(len(prompts))] == solo, mode
        # the prefix was cached: the batched requests decoded over its shared blocks
        assert all(results[i].stats.num_cached_tokens >= 48 for i in range(len(prompts)))
