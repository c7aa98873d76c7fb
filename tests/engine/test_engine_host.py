"""LLMEngine over a pure-Python model runner: concurrency, streaming, stops, aborts, errors.

The fake runner keeps a real paged "cache" of token ids: each step writes the segment's tokens
into the slots its block table names, and the next token is a function of the context READ
BACK through the block table. Wrong block tables, a bad prefix hit or a lost block after a
preemption therefore change the output, and every output is checked against the same function
applied to the true token list.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import zlib

import pytest

from langchain_ascend.engine.core.batch import ScheduledBatch
from langchain_ascend.engine.core.outputs import TokenDelta
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.llm_engine import LLMEngine
from langchain_ascend.engine.loader import LoadedModel
from langchain_ascend.engine.streams import SyncTokenStream, ThreadSink
from langchain_ascend.errors import (
    EngineClosedError,
    EngineStepError,
    InvalidArgumentTypeError,
    InvalidRequestError,
    PromptTooLongError,
    RequestAbortedError,
)
from langchain_ascend.testing import build_tokenizer, load_tokenizer

VOCAB = 4096
TEXT_IDS = range(300, 3000)  # ordinary multi-character tokens of the test tokenizer


def hash_next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of the whole context."""
    digest = zlib.crc32(repr(context).encode())
    return TEXT_IDS[digest % len(TEXT_IDS)]


class FakeConfig:
    vocab_size = VOCAB


class FakeRunner:
    """The ModelRunner interface over a token-id 'KV cache'."""

    def __init__(self, num_blocks=64, block_size=4, max_model_len=512, next_token=hash_next_token,
                 step_delay=0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.config = FakeConfig()
        self.device = "fake"
        self.dtype = "fake"
        self.next_token = next_token
        self.step_delay = step_delay
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.fail_when = None  # callable(batch) -> bool: raise in that step
        self.released: list[str] = []
        self.batch_sizes: list[int] = []
        self.warmed_up = False
        self.executing = threading.Event()
        self.threads: list[threading.Thread] = []  # the thread of every step
        self.interrupt_when = None  # callable(batch) -> bool: KeyboardInterrupt in that step
        self.copies: list[tuple[int, int]] = []
        self.tables: dict[str, list[int]] = {}  # the last block table of every request

    def slot(self, block_ids, pos):
        return block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, batch: ScheduledBatch):
        self.executing.set()
        self.threads.append(threading.current_thread())
        if self.interrupt_when is not None and self.interrupt_when(batch):
            self.interrupt_when = None
            raise KeyboardInterrupt
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.fail_when is not None and self.fail_when(batch):
            raise RuntimeError("simulated device failure")
        self.batch_sizes.append(len(batch.segments))
        results = []
        for seg in batch.segments:
            self.tables[seg.request_id] = list(seg.block_ids)
            for offset, tok in enumerate(seg.token_ids):
                self.slots[self.slot(seg.block_ids, seg.start_pos + offset)] = tok
            if not seg.sample:
                results.append(None)
                continue
            end = seg.start_pos + len(seg.token_ids)
            context = [self.slots[self.slot(seg.block_ids, p)] for p in range(end)]
            results.append(self.next_token(context))
        return results

    def copy_block(self, src, dst):
        size = self.block_size
        self.slots[dst * size:(dst + 1) * size] = self.slots[src * size:(src + 1) * size]
        self.copies.append((src, dst))

    def release(self, request_ids):
        self.released.extend(request_ids)

    def warmup(self):
        self.warmed_up = True


def reference(prompt: list[int], max_tokens: int, next_token=hash_next_token) -> list[int]:
    context = list(prompt)
    for _ in range(max_tokens):
        context.append(next_token(context))
    return context[len(prompt):]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tokenizer(VOCAB))


class FakeDevice:
    def __init__(self, type: str) -> None:
        self.type = type


# Who runs the steps: "loop" - the background loop thread (accelerators); "caller" - on a CPU
# device a thread blocked in generate() drives the steps itself (see engine/driver.py's docstring).
DRIVERS = {"loop": "fake", "caller": "cpu"}


@pytest.fixture(params=list(DRIVERS))
def make_engine(tokenizer, request):
    engines = []

    def factory(runner=None, **kwargs):
        runner = runner or FakeRunner()
        runner.device = FakeDevice(DRIVERS[request.param])
        engine = LLMEngine.from_runner(runner, tokenizer,
                                       eos_token_ids=[tokenizer.eos_token_id], **kwargs)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.shutdown()


def prompt_of(seed: int, length: int) -> list[int]:
    return [TEXT_IDS[(seed * 131 + i * 17) % len(TEXT_IDS)] for i in range(length)]


def test_single_request_matches_reference_and_reports_stats(make_engine):
    engine = make_engine()
    prompt = prompt_of(1, 10)
    out = engine.generate(prompt, SamplingParams(max_tokens=9))
    assert out.token_ids == reference(prompt, 9)
    assert out.finish_reason == "length" and out.prompt_token_ids == prompt
    assert out.text == engine.tokenizer.decode(out.token_ids)
    s = out.stats
    assert (s.num_prompt_tokens, s.num_generated_tokens, s.num_cached_tokens) == (10, 9, 0)
    assert 0 <= s.queue_time <= s.time_to_first_token and s.decode_time >= 0
    stats = engine.stats()
    assert stats.num_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    assert stats.num_steps == 9


def test_concurrent_threads_are_batched_and_each_output_is_exact(make_engine):
    runner = FakeRunner(num_blocks=128, step_delay=0.002)
    engine = make_engine(runner)
    prompts = [prompt_of(i, 3 + 5 * i) for i in range(12)]
    results: dict[int, list[int]] = {}

    def call(i):
        results[i] = engine.generate(prompts[i], SamplingParams(max_tokens=6 + i)).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(results[i] == reference(prompts[i], 6 + i) for i in range(12))
    assert max(runner.batch_sizes) > 1
    assert engine.stats().num_steps < sum(6 + i for i in range(12))


async def test_concurrent_asyncio_tasks(make_engine):
    engine = make_engine(FakeRunner(num_blocks=128))
    prompts = [prompt_of(i, 4 + 3 * i) for i in range(8)]
    outs = await asyncio.gather(*(engine.agenerate(p, SamplingParams(max_tokens=5))
                                  for p in prompts))
    assert [o.token_ids for o in outs] == [reference(p, 5) for p in prompts]


def test_prefix_cache_hits_across_hops_and_requests(make_engine):
    engine = make_engine()
    system = prompt_of(7, 13)
    history = list(system)
    cached = []
    for hop in range(4):
        history += prompt_of(20 + hop, 3)
        out = engine.generate(history, SamplingParams(max_tokens=5))
        assert out.token_ids == reference(history, 5)
        cached.append(out.stats.num_cached_tokens)
        history += out.token_ids
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    # hop n reuses hop n-1's prompt and generated tokens up to the last full block
    assert cached[3] >= len(history) - 5 - 3 - 2 * 4
    other = engine.generate(system + [5], SamplingParams(max_tokens=2))
    assert other.stats.num_cached_tokens == 12
    stats = engine.stats()
    assert stats.prefix_cache_hits > 0 and 0 < stats.hit_rate < 1


def test_prefix_caching_disabled(make_engine):
    engine = make_engine(enable_prefix_caching=False)
    prompt = prompt_of(3, 12)
    engine.generate(prompt, SamplingParams(max_tokens=2))
    out = engine.generate(prompt, SamplingParams(max_tokens=2))
    assert out.stats.num_cached_tokens == 0
    assert engine.stats().num_blocks_cached == 0


def test_tiny_pool_preempts_and_outputs_stay_exact(make_engine):
    runner = FakeRunner(num_blocks=12, block_size=4)
    engine = make_engine(runner, max_num_batched_tokens=16)
    shared = prompt_of(9, 6)
    prompts = [shared + prompt_of(i, 2 + i % 4) for i in range(8)]
    # submitted together (a stream submits at once; its deltas queue up until read)
    streams = [engine.stream(p, SamplingParams(max_tokens=14)) for p in prompts]
    results = [list(stream)[-1].output for stream in streams]
    assert [r.token_ids for r in results] == [reference(p, 14) for p in prompts]
    assert engine.stats().num_preemptions > 0
    assert sum(r.stats.num_preemptions for r in results) > 0
    assert engine.stats().num_blocks_used == 0


def test_chunked_prefill_of_a_long_prompt(make_engine):
    runner = FakeRunner(num_blocks=64)
    engine = make_engine(runner, max_num_batched_tokens=8)
    prompt = prompt_of(4, 45)
    out = engine.generate(prompt, SamplingParams(max_tokens=3))
    assert out.token_ids == reference(prompt, 3)
    assert engine.stats().num_steps == 6 + 2  # ceil(45 / 8) prefill chunks, then 2 decodes


def test_stream_deltas_add_up_to_the_output(make_engine):
    engine = make_engine()
    prompt = prompt_of(5, 6)
    deltas = list(engine.stream(prompt, SamplingParams(max_tokens=7)))
    assert [d.finished for d in deltas] == [False] * 6 + [True]
    final = deltas[-1].output
    assert [t for d in deltas for t in d.token_ids] == final.token_ids == reference(prompt, 7)
    assert "".join(d.text for d in deltas) == final.text
    assert deltas[-1].finish_reason == "length"


def script_runner(tokenizer, text: str, **kwargs) -> FakeRunner:
    """A fake model that, whatever the prompt, generates the tokens of ``text`` then EOS."""
    script = tokenizer.encode(text) + [tokenizer.eos_token_id]
    prompt_len = kwargs.pop("prompt_len")
    return FakeRunner(next_token=lambda ctx: script[min(len(ctx) - prompt_len, len(script) - 1)],
                      **kwargs)


def test_stop_string_spanning_tokens(make_engine, tokenizer):
    engine = make_engine(script_runner(tokenizer, "Hello world. END of text", prompt_len=3))
    params = SamplingParams(max_tokens=50, stop=["END of"])
    deltas = list(engine.stream([300, 301, 302], params))
    final = deltas[-1].output
    assert final.text == "Hello world. "
    assert "".join(d.text for d in deltas) == "Hello world. "
    assert final.finish_reason == "stop" and final.stop_reason == "END of"
    assert engine.stats().num_blocks_used == 0
    plain = engine.generate([300, 301, 302], params)
    assert plain.text == "Hello world. " and plain.stop_reason == "END of"


def test_eos_ends_and_is_not_returned(make_engine, tokenizer):
    engine = make_engine(script_runner(tokenizer, "Hi there", prompt_len=2))
    out = engine.generate([300, 301], SamplingParams(max_tokens=50))
    assert out.text == "Hi there" and out.finish_reason == "stop" and out.stop_reason is None
    assert out.token_ids == tokenizer.encode("Hi there")
    assert out.stats.num_generated_tokens == len(out.token_ids) + 1
    ignoring = engine.generate([300, 301], SamplingParams(max_tokens=6, ignore_eos=True))
    assert ignoring.finish_reason == "length" and len(ignoring.token_ids) == 6


def test_stop_token_ids(make_engine, tokenizer):
    script = tokenizer.encode("a b c d")
    engine = make_engine(script_runner(tokenizer, "a b c d", prompt_len=2))
    out = engine.generate([300, 301], SamplingParams(max_tokens=50, stop_token_ids=[script[2]]))
    assert out.token_ids == script[:2] and out.stop_reason == script[2]


def test_max_context_length_caps_generation(make_engine):
    engine = make_engine(max_context_length=20)
    out = engine.generate(prompt_of(1, 15), SamplingParams(max_tokens=100))
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_abort_from_another_thread_frees_blocks(make_engine):
    runner = FakeRunner(step_delay=0.01)
    engine = make_engine(runner)
    errors = []

    def call():
        try:
            engine.generate(prompt_of(2, 9), SamplingParams(max_tokens=10_000, ignore_eos=True),
                            request_id="victim")
        except RequestAbortedError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    runner.executing.wait(5)
    assert engine.stats().num_blocks_used > 0
    engine.abort("victim")
    assert engine.stats().num_blocks_used == 0  # freed before abort() returned
    thread.join(5)
    assert len(errors) == 1 and "victim" in str(errors[0])
    engine.abort("victim")  # unknown now: ignored
    for _ in range(200):  # the loop lets the runner drop the request's state
        if "victim" in runner.released:
            break
        time.sleep(0.01)
    assert "victim" in runner.released
    # the id is free again
    assert engine.generate(prompt_of(2, 3), SamplingParams(max_tokens=2),
                           request_id="victim").finish_reason == "length"


def test_closing_a_stream_aborts_at_once(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    stream = engine.stream(prompt_of(1, 6), SamplingParams(max_tokens=10_000))
    next(stream)
    next(stream)
    assert engine.stats().num_blocks_used > 0
    stream.close()
    assert engine.stats().num_blocks_used == 0
    assert list(stream) == []


def test_dropping_a_stream_aborts(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    stream = engine.stream(prompt_of(1, 6), SamplingParams(max_tokens=10_000))
    next(stream)
    del stream
    gc.collect()
    stats = engine.stats()
    assert stats.num_blocks_used == 0 and stats.num_running + stats.num_waiting == 0


async def test_cancelling_an_async_task_aborts(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    seen = asyncio.Event()

    async def consume():
        async for _ in engine.astream(prompt_of(1, 6), SamplingParams(max_tokens=10_000)):
            seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(seen.wait(), 5)
    assert engine.stats().num_blocks_used > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.stats().num_blocks_used == 0

    gen_task = asyncio.create_task(engine.agenerate(prompt_of(2, 6),
                                                    SamplingParams(max_tokens=10_000)))
    await asyncio.sleep(0.05)
    gen_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gen_task
    assert engine.stats().num_blocks_used == 0


async def test_astream_deltas_match_generate(make_engine):
    engine = make_engine()
    prompt = prompt_of(8, 5)
    deltas = [d async for d in engine.astream(prompt, SamplingParams(max_tokens=6))]
    assert deltas[-1].finished
    assert [t for d in deltas for t in d.token_ids] == reference(prompt, 6)


@pytest.mark.parametrize(
    ("prompt", "params", "error", "match"),
    [
        ([], SamplingParams(), InvalidRequestError, "empty"),
        ("hello", SamplingParams(), InvalidRequestError, "tokenize"),
        ([1, None], SamplingParams(), InvalidRequestError, "list of ints"),
        ([1, VOCAB], SamplingParams(), InvalidRequestError, "vocabulary"),
        ([-1], SamplingParams(), InvalidRequestError, "vocabulary"),
        ([300] * 100, SamplingParams(), PromptTooLongError, "max_context_length"),
        ([300, 301], SamplingParams(max_tokens=0), InvalidRequestError, "max_tokens"),
        ([300, 301], SamplingParams(temperature=-1), InvalidRequestError, "temperature"),
        ([300, 301], {"max_tokens": 3}, InvalidRequestError, "SamplingParams"),
        ([300, 301], SamplingParams(stop_token_ids=["x"]), InvalidRequestError, "stop_token"),
        ([300, 301], SamplingParams(stop=[""]), InvalidRequestError, "stop strings"),
        ([300, 301], SamplingParams(temperature=float("nan")), InvalidRequestError,
         r"temperature must be a finite number >= 0, got nan"),
        ([300, 301], SamplingParams(temperature=float("inf")), InvalidRequestError,
         "temperature"),
        ([300, 301], SamplingParams(temperature="0.5"), InvalidArgumentTypeError,
         "temperature"),
        ([300, 301], SamplingParams(top_p=0.0), InvalidRequestError, r"top_p .*\(0, 1\]"),
        ([300, 301], SamplingParams(top_p=float("nan")), InvalidRequestError, "top_p"),
        ([300, 301], SamplingParams(top_p=1.5), InvalidRequestError, "top_p"),
        ([300, 301], SamplingParams(top_k=2.7), InvalidArgumentTypeError, "top_k.*float 2.7"),
        ([300, 301], SamplingParams(top_k=True), InvalidArgumentTypeError, "top_k"),
        ([300, 301], SamplingParams(top_k=-1), InvalidRequestError, "top_k"),
        ([300, 301], SamplingParams(max_tokens=True), InvalidArgumentTypeError, "max_tokens"),
        ([300, 301], SamplingParams(max_tokens=2.0), InvalidArgumentTypeError, "max_tokens"),
        ([300, 301], SamplingParams(seed=-1), InvalidRequestError, r"seed .*\[0, 9223372036854775807\]"),
        ([300, 301], SamplingParams(seed=2**63), InvalidRequestError, "seed"),
        ([300, 301], SamplingParams(seed=False), InvalidArgumentTypeError, "seed"),
        ([300, 301], SamplingParams(seed="7"), InvalidArgumentTypeError, "seed"),
        ([300, 301], SamplingParams(stop=[3]), InvalidArgumentTypeError, "stop"),
        ([300, 301], SamplingParams(stop=None), InvalidArgumentTypeError, "stop"),
        ([300, 301], SamplingParams(stop_token_ids=[True]), InvalidArgumentTypeError,
         "stop_token_ids"),
        ([300, 301], SamplingParams(stop_token_ids=[-2]), InvalidRequestError,
         "stop_token_ids"),
        ([300, 301], SamplingParams(ignore_eos="yes"), InvalidArgumentTypeError, "ignore_eos"),
        ([300, 301], SamplingParams(constraint=object()), InvalidArgumentTypeError,
         "constraint"),
    ],
)
def test_bad_input_raises_typed_errors_and_engine_keeps_serving(make_engine, prompt, params,
                                                               error, match):
    engine = make_engine(max_context_length=64)
    with pytest.raises(error, match=match):
        engine.generate(prompt, params)
    with pytest.raises(error, match=match):
        engine.stream(prompt, params)
    good = engine.generate([300, 301], SamplingParams(max_tokens=2))
    assert good.token_ids == reference([300, 301], 2)


def test_prompt_larger_than_the_pool(make_engine):
    engine = make_engine(FakeRunner(num_blocks=4, block_size=4))
    with pytest.raises(PromptTooLongError, match="KV cache"):
        engine.generate(prompt_of(1, 17), SamplingParams(max_tokens=1))
    out = engine.generate(prompt_of(1, 16), SamplingParams(max_tokens=5))
    assert out.finish_reason == "length" and len(out.token_ids) == 1  # the pool is full


def test_duplicate_live_request_id(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    stream = engine.stream([300], SamplingParams(max_tokens=1000), request_id="x")
    with pytest.raises(InvalidRequestError, match="in flight"):
        engine.generate([300], SamplingParams(max_tokens=1), request_id="x")
    stream.close()


def test_constructor_arguments_are_checked(tokenizer):
    with pytest.raises(InvalidRequestError, match="max_batch_size"):
        LLMEngine.from_runner(FakeRunner(), tokenizer, max_batch_size=0)
    with pytest.raises(InvalidRequestError, match="max_position_embeddings"):
        LLMEngine.from_runner(FakeRunner(max_model_len=32), tokenizer, max_context_length=64)


def test_failed_step_fails_its_requests_and_engine_keeps_serving(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner)
    runner.fail_when = lambda batch: any(s.request_id == "doomed" for s in batch.segments)
    with pytest.raises(EngineStepError, match="doomed") as info:
        engine.generate([300, 301], SamplingParams(max_tokens=3), request_id="doomed")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert engine.stats().num_blocks_used == 0
    ok = engine.generate([300, 302], SamplingParams(max_tokens=3))
    assert ok.token_ids == reference([300, 302], 3)


def test_dead_loop_reports_engine_closed(make_engine, monkeypatch):
    engine = make_engine()
    engine.generate([300], SamplingParams(max_tokens=1))

    def broken(*args, **kwargs):
        raise KeyError("bookkeeping bug")

    monkeypatch.setattr(engine.driver.scheduler, "update", broken)
    with pytest.raises(EngineClosedError, match="bookkeeping bug"):
        engine.generate([300, 301], SamplingParams(max_tokens=2))
    with pytest.raises(EngineClosedError):
        engine.generate([300, 301], SamplingParams(max_tokens=2))


def test_shutdown_fails_in_flight_and_later_requests(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    stream = engine.stream([300, 301], SamplingParams(max_tokens=10_000))
    next(stream)
    engine.shutdown()
    with pytest.raises(EngineClosedError):
        for _ in stream:
            pass
    with pytest.raises(EngineClosedError, match="shut down"):
        engine.generate([300], SamplingParams(max_tokens=1))
    engine.shutdown()  # idempotent


def test_warmup_and_idle_release(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner)
    engine.warmup()
    assert runner.warmed_up
    engine.generate([300], SamplingParams(max_tokens=2), request_id="r1")
    for _ in range(100):
        if "r1" in runner.released:
            break
        time.sleep(0.01)
    assert "r1" in runner.released


async def test_breaking_out_of_astream_aborts(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    async for _ in engine.astream(prompt_of(3, 6), SamplingParams(max_tokens=10_000)):
        break
    for _ in range(100):  # the async generator is closed by the event loop's finalizer
        if engine.stats().num_blocks_used == 0:
            break
        await asyncio.sleep(0.01)
    stats = engine.stats()
    assert stats.num_blocks_used == 0 and stats.num_running + stats.num_waiting == 0


def test_breaking_out_of_a_sync_stream_aborts(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    for _ in engine.stream(prompt_of(3, 6), SamplingParams(max_tokens=10_000)):
        break
    gc.collect()
    assert engine.stats().num_blocks_used == 0


def test_step_failure_spares_a_new_request_reusing_an_aborted_id(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner)
    calls = []

    def fail_first(batch):
        calls.append(batch)
        if len(calls) == 1:
            engine.abort("same")  # the caller's request is gone while the step runs...
            thread = threading.Thread(target=lambda: results.append(engine.generate(
                [300, 305], SamplingParams(max_tokens=2), request_id="same")))
            thread.start()  # ...and a new one takes its id
            time.sleep(0.1)
            return True
        return False

    results = []
    runner.fail_when = fail_first
    with pytest.raises(RequestAbortedError):
        engine.generate([300, 301], SamplingParams(max_tokens=2), request_id="same")
    for _ in range(200):
        if results:
            break
        time.sleep(0.01)
    assert results and results[0].token_ids == reference([300, 305], 2)


def test_abort_from_a_finalizer_while_the_lock_is_held_is_deferred_not_deadlocked(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.005))
    stream = engine.stream(prompt_of(3, 6), SamplingParams(max_tokens=10_000))
    next(stream)
    with engine.driver.lock:  # as if a garbage collection ran the finalizer inside a locked section
        stream.close()
    for _ in range(200):
        if engine.stats().num_blocks_used == 0:
            break
        time.sleep(0.005)
    stats = engine.stats()
    assert stats.num_blocks_used == 0 and stats.num_running + stats.num_waiting == 0


def test_second_session_relocates_cached_blocks_and_first_session_still_hits(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner)
    shared = prompt_of(11, 12)  # 3 full blocks of 4
    first = shared + prompt_of(12, 9)
    out_a = engine.generate(first, SamplingParams(max_tokens=3), request_id="A")
    # B shares the 3 prompt blocks; A's cached blocks follow them in the cache and are moved
    # aside so that B's own blocks continue right after the prompt's.
    second = shared + prompt_of(13, 9)
    out_b = engine.generate(second, SamplingParams(max_tokens=3), request_id="B")
    assert out_b.token_ids == reference(second, 3)
    assert runner.copies and engine.driver.kv.pool.num_relocations == len(runner.copies)
    table_b = runner.tables["B"]
    assert table_b[:3] == runner.tables["A"][:3]
    assert table_b == list(range(table_b[0], table_b[0] + len(table_b)))
    # A's next hop hits its moved blocks: the K/V (here: token ids) came along.
    history = first + out_a.token_ids + prompt_of(14, 5)
    out_a2 = engine.generate(history, SamplingParams(max_tokens=4), request_id="A2")
    assert out_a2.stats.num_cached_tokens >= 20
    assert out_a2.token_ids == reference(history, 4)


def _cpu_engine(make_engine, runner: FakeRunner) -> LLMEngine:
    engine = make_engine(runner)
    if engine.driver.callers_drive is False:
        pytest.skip("the caller drives the steps on CPU devices only")
    return engine


def test_cpu_generate_runs_its_steps_on_the_calling_thread(make_engine):
    runner = FakeRunner()
    engine = _cpu_engine(make_engine, runner)
    out = engine.generate(prompt_of(1, 9), SamplingParams(max_tokens=5), request_id="r1")
    assert out.token_ids == reference(prompt_of(1, 9), 5)
    assert runner.threads and set(runner.threads) == {threading.current_thread()}
    assert engine.driver.thread is None  # no loop thread was started
    assert "r1" in runner.released  # released by the caller before it returned


async def test_cpu_loop_thread_serves_coroutines_then_ends(make_engine):
    runner = FakeRunner()
    engine = _cpu_engine(make_engine, runner)
    outs = await asyncio.gather(*(engine.agenerate(prompt_of(i, 5), SamplingParams(max_tokens=4))
                                  for i in range(3)))
    assert [o.token_ids for o in outs] == [reference(prompt_of(i, 5), 4) for i in range(3)]
    assert threading.current_thread() not in runner.threads
    for _ in range(200):  # out of work, the loop thread ends (and its OpenMP pool with it)
        if engine.driver.thread is None:
            break
        await asyncio.sleep(0.01)
    assert engine.driver.thread is None


def test_interrupted_caller_step_spares_the_other_requests(make_engine):
    runner = FakeRunner(step_delay=0.002)
    engine = _cpu_engine(make_engine, runner)
    other_prompt = prompt_of(7, 6)
    results: dict[str, object] = {}

    def driver() -> None:
        try:
            engine.generate(prompt_of(2, 5), SamplingParams(max_tokens=200), request_id="mine")
        except BaseException as exc:  # noqa: BLE001 - the interrupt is the point
            results["mine"] = exc

    def other() -> None:
        results["other"] = engine.generate(other_prompt, SamplingParams(max_tokens=6),
                                           request_id="other")

    # Interrupt the first step that holds both requests, on whichever thread drives it.
    runner.interrupt_when = lambda batch: {s.request_id for s in batch.segments} == {
        "mine", "other"}
    first = threading.Thread(target=driver)
    first.start()
    assert runner.executing.wait(5)
    second = threading.Thread(target=other)
    second.start()
    first.join(10)
    second.join(10)
    interrupted = [k for k, v in results.items() if isinstance(v, KeyboardInterrupt)]
    assert interrupted == ["mine"]  # the driver of that step was the first caller
    assert results["other"].token_ids == reference(other_prompt, 6)
    assert engine.stats().num_blocks_used == 0
    again = engine.generate(prompt_of(3, 4), SamplingParams(max_tokens=3))
    assert again.token_ids == reference(prompt_of(3, 4), 3)


def test_a_single_stop_string_is_one_stop_and_a_single_id_one_id(make_engine, tokenizer):
    engine = make_engine()
    params = SamplingParams(max_tokens=3, stop="###", stop_token_ids=7)
    engine.generate(prompt_of(4, 5), params)
    assert params.stop == ["###"] and params.stop_token_ids == [7]
    tuple_params = SamplingParams(max_tokens=3, stop=("a b", "c"), stop_token_ids=(7, 8))
    tuple_params.validate()
    assert tuple_params.stop == ["a b", "c"] and tuple_params.stop_token_ids == [7, 8]


def test_a_sync_stream_kept_but_not_read_is_aborted_at_its_buffer_bound(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.001), stream_buffer_limit=8)
    free_at_start = engine.stats().num_blocks_free
    stream = engine.stream(prompt_of(5, 6), SamplingParams(max_tokens=10_000, ignore_eos=True))
    first = next(stream)
    for _ in range(500):  # the engine generates on; the stream is still referenced
        if engine.stats().num_running + engine.stats().num_waiting == 0:
            break
        time.sleep(0.01)
    stats = engine.stats()
    assert stats.num_blocks_free == free_at_start and stats.num_running == 0
    rest = []
    with pytest.raises(RequestAbortedError, match="stream_buffer_limit"):
        for delta in stream:
            rest.append(delta)
    tokens = first.token_ids + [t for d in rest for t in d.token_ids]
    assert len(rest) == 8 and tokens == reference(prompt_of(5, 6), 9)


async def test_an_astream_kept_but_not_read_is_aborted_at_its_buffer_bound(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.001), stream_buffer_limit=8)
    free_at_start = engine.stats().num_blocks_free
    agen = engine.astream(prompt_of(6, 6), SamplingParams(max_tokens=10_000, ignore_eos=True))
    async for _ in agen:  # break without aclose(); agen stays referenced
        break
    for _ in range(500):
        if engine.stats().num_running + engine.stats().num_waiting == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats().num_blocks_free == free_at_start
    with pytest.raises(RequestAbortedError, match="unread"):
        async for _ in agen:
            pass


async def test_a_garbage_collected_astream_frees_its_blocks(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.002))
    free_at_start = engine.stats().num_blocks_free
    agen = engine.astream(prompt_of(7, 6), SamplingParams(max_tokens=10_000, ignore_eos=True))
    await agen.__anext__()
    assert engine.stats().num_blocks_free < free_at_start
    del agen  # asyncio's async-generator finalizer closes it on the loop
    gc.collect()
    for _ in range(200):
        if engine.stats().num_blocks_free == free_at_start:
            break
        await asyncio.sleep(0.01)
    stats = engine.stats()
    assert stats.num_blocks_free == free_at_start
    assert stats.num_running + stats.num_waiting == 0


def test_a_sync_stream_dropped_while_generating_frees_its_blocks(make_engine):
    engine = make_engine(FakeRunner(step_delay=0.002))
    free_at_start = engine.stats().num_blocks_free
    stream = engine.stream(prompt_of(8, 9), SamplingParams(max_tokens=10_000, ignore_eos=True))
    next(stream)
    assert engine.stats().num_blocks_free < free_at_start
    del stream
    stats = engine.stats()  # the finalizer ran on del (no cycle holds the stream)
    assert stats.num_blocks_free == free_at_start
    assert stats.num_running + stats.num_waiting == 0


def test_a_slow_reader_within_the_bound_gets_every_token(make_engine):
    engine = make_engine(FakeRunner(), stream_buffer_limit=64)
    prompt = prompt_of(9, 5)
    stream = engine.stream(prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    tokens = []
    for delta in stream:
        time.sleep(0.001)
        tokens.extend(delta.token_ids)
    assert tokens == reference(prompt, 40)


def test_the_engine_holds_one_driver_over_its_runner(make_engine):
    runner = FakeRunner()
    engine = make_engine(runner)
    assert engine.driver.runner is runner
    assert engine.driver.kv.capacity_tokens == runner.num_blocks * runner.block_size
    assert engine.generate(prompt_of(2, 4), SamplingParams(max_tokens=2)).token_ids == \
        reference(prompt_of(2, 4), 2)
    engine.shutdown()
    assert engine.driver.runner is None and engine.is_closed


def test_a_loaded_model_refuses_loading_settings(tokenizer):
    model = LoadedModel.by_hand(FakeRunner(), tokenizer)
    assert model.eos_token_ids == (tokenizer.eos_token_id,)
    with pytest.raises(InvalidRequestError, match="num_blocks, quantization only apply"):
        LLMEngine(model, num_blocks=8, quantization="int8")
    engine = LLMEngine(model, max_batch_size=2)  # engine settings are fine
    try:
        assert engine.eos_token_ids == [tokenizer.eos_token_id] and engine.model_path == ""
    finally:
        engine.shutdown()


def test_a_sync_stream_calls_its_abort_once_and_never_after_the_end():
    calls = []
    sink = ThreadSink()
    stream = SyncTokenStream("r", sink, lambda: calls.append("abort"))
    stream.close()
    stream.close()
    assert calls == ["abort"]
    with pytest.raises(StopIteration):
        next(stream)
    finished = ThreadSink()
    done = SyncTokenStream("s", finished, lambda: calls.append("late"))
    finished.put(TokenDelta("s", [1], "x", finished=True, finish_reason="stop"))
    assert next(done).finished
    done.close()
    assert calls == ["abort"]  # a finished request is not aborted
