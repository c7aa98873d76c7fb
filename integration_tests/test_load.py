"""Load on the tiny real model (CPU, fp32, greedy): many sessions on a pool too small for
them, and many sequential requests.

- 64 concurrent agent-like sessions (32 threads, 32 asyncio tasks), 5 hops each (every hop's
  prompt = the previous prompt + its reply + a new user tail), on a KV pool that holds a few
  sessions at once: the scheduler must preempt and the prefix cache evict. Every request
  completes, each session's outputs equal its solo run, and no block is leaked.
- 10,000 sequential tiny requests (1-2 tokens): resident memory grows by a bounded amount.

Figures (p50/p99 hop latency, throughput, RSS) are printed, not asserted:
``pytest integration_tests/test_load.py -s``.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import threading
import time

import pytest

pytest.importorskip("torch")

from langchain_ascend.engine import LLMEngine  # noqa: E402
from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402
from langchain_ascend.testing import build_model  # noqa: E402

NUM_SESSIONS = 64
NUM_HOPS = 5
MAX_TOKENS = 6
BLOCK_SIZE = 4
NUM_BLOCKS = 128  # 512 token slots; the 64 sessions need ~3,500 at once at their last hop


@pytest.fixture(scope="module")
def engine():
    """The tiny model with one intra-op thread: it gains nothing from more, and on a shared
    2-core host OpenMP's barriers made each step ~50x slower (168 ms vs 3.4 ms a request)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = build_model("tiny", "qwen2")
    engine = LLMEngine(path, device="cpu", dtype="float32", block_size=BLOCK_SIZE,
                       num_blocks=NUM_BLOCKS, max_num_batched_tokens=512, max_batch_size=64)
    yield engine
    engine.shutdown()
    torch.set_num_threads(threads)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def session_opening(i: int) -> list[int]:
    """A shared 'system prompt' (8 tokens, prefix-cache material) + the session's own turn."""
    return [11, 12, 13, 14, 15, 16, 17, 18] + [100 + (i * 37 + k * 11) % 3000 for k in range(6)]


def hop_tail(i: int, hop: int) -> list[int]:
    return [200 + (i * 13 + hop * 7 + k) % 2800 for k in range(4)]


PARAMS = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def run_session_sync(engine, i, latencies):
    prompt, outputs = session_opening(i), []
    for hop in range(NUM_HOPS):
        start = time.perf_counter()
        out = engine.generate(prompt, PARAMS)
        latencies.append(time.perf_counter() - start)
        outputs.append(out.token_ids)
        prompt = prompt + out.token_ids + hop_tail(i, hop)
    return outputs


async def run_session_async(engine, i, latencies):
    prompt, outputs = session_opening(i), []
    for hop in range(NUM_HOPS):
        start = time.perf_counter()
        out = await engine.agenerate(prompt, PARAMS)
        latencies.append(time.perf_counter() - start)
        outputs.append(out.token_ids)
        prompt = prompt + out.token_ids + hop_tail(i, hop)
    return outputs


def test_64_sessions_on_a_small_pool_match_their_solo_runs(engine):
    free_at_start = engine.stats().num_blocks_free
    solo = {i: run_session_sync(engine, i, []) for i in range(NUM_SESSIONS)}
    engine.reset_prefix_cache()  # the concurrent run starts cold, like the solo ones did
    preemptions_before = engine.stats().num_preemptions
    evictions_before = engine.driver.kv.pool.num_evictions

    latencies: list[float] = []
    results: dict[int, object] = {}
    threaded = range(0, NUM_SESSIONS, 2)
    asynced = range(1, NUM_SESSIONS, 2)

    def thread_session(i):
        try:
            results[i] = run_session_sync(engine, i, latencies)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc

    def asyncio_sessions():
        async def main():
            outs = await asyncio.gather(*(run_session_async(engine, i, latencies)
                                          for i in asynced), return_exceptions=True)
            results.update(dict(zip(asynced, outs, strict=True)))
        asyncio.run(main())

    start = time.perf_counter()
    threads = [threading.Thread(target=thread_session, args=(i,)) for i in threaded]
    threads.append(threading.Thread(target=asyncio_sessions))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    wall = time.perf_counter() - start
    assert not any(t.is_alive() for t in threads)

    failures = {i: r for i, r in results.items() if isinstance(r, BaseException)}
    assert not failures
    assert len(results) == NUM_SESSIONS
    mismatched = [i for i in range(NUM_SESSIONS) if results[i] != solo[i]]
    assert not mismatched
    stats = engine.stats()
    preemptions = stats.num_preemptions - preemptions_before
    evictions = engine.driver.kv.pool.num_evictions - evictions_before
    assert preemptions > 0 and evictions > 0  # the pool was too small for all of them
    assert stats.num_blocks_used == 0 and stats.num_blocks_free == free_at_start
    assert stats.num_running == stats.num_waiting == 0

    hops = NUM_SESSIONS * NUM_HOPS
    lat = sorted(latencies)
    print(f"\nload: {NUM_SESSIONS} sessions x {NUM_HOPS} hops on {NUM_BLOCKS} blocks of "
          f"{BLOCK_SIZE}: {hops} requests in {wall:.1f} s = {hops / wall:.1f} hops/s, "
          f"{hops * MAX_TOKENS / wall:.1f} generated tokens/s; hop latency p50 "
          f"{statistics.median(lat) * 1e3:.0f} ms, p99 {lat[int(0.99 * (len(lat) - 1))] * 1e3:.0f}"
          f" ms; {preemptions} preemptions, {evictions} evictions, "
          f"prefix hits {stats.prefix_cache_hits}/{stats.prefix_cache_queries} tokens")


def test_10000_sequential_tiny_requests_keep_memory_bounded(engine):
    prompts = [[300 + i % 50, 400 + i % 7, 500] for i in range(10_000)]
    for prompt in prompts[:300]:  # warm: allocator pools, caches, the detokenizer
        engine.generate(prompt, SamplingParams(max_tokens=2))
    gc.collect()
    before = rss_mib()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        out = engine.generate(prompt, SamplingParams(max_tokens=1 + i % 2, ignore_eos=True))
        assert len(out.token_ids) == 1 + i % 2
    wall = time.perf_counter() - start
    gc.collect()
    after = rss_mib()
    stats = engine.stats()
    print(f"\nmemory: 10,000 sequential requests in {wall:.1f} s "
          f"({10_000 / wall:.0f} req/s); RSS {before:.1f} MiB -> {after:.1f} MiB "
          f"({after - before:+.1f} MiB)")
    assert stats.num_blocks_used == 0 and stats.num_running + stats.num_waiting == 0
    assert after - before < 50
