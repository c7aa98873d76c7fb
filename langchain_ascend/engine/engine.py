"""LLMEngine: one model, one paged KV cache, one background loop shared by every caller.

Threads and asyncio tasks submit requests; one thread at a time (the *driver*) repeats
*schedule -> model step -> update* and hands each request's tokens back to its caller: a
``queue.Queue`` for threads, an ``asyncio.Queue`` fed through ``loop.call_soon_threadsafe`` for
coroutines. Requests join and leave the running batch at every step.

Who drives: a background loop thread (started on demand) serves coroutines and streams. On the
CPU, a thread blocked in :meth:`LLMEngine.generate` drives the steps itself while nobody else
does, and the loop thread ends when it runs out of work. The reason is measured: torch's CPU
kernels run on a per-thread OpenMP (libgomp) pool, and once the process holds more pool threads
than cores, every pool falls back to sleeping between parallel regions. A decode step of the
bench model then took 28-32 ms instead of 20-22 ms when the caller's thread had its own pool
besides the loop thread's (2-core host). Driving from the caller uses the caller's pool.

Locking: ``_lock`` guards the scheduler, the block pool and the per-request state. The loop
holds it while scheduling and while applying a step's results, never while the model runs, so
``abort`` (and a closed stream or a cancelled task) frees a request's blocks at once.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import queue
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_ascend.engine.core.batch import ScheduledBatch
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.outputs import EngineStats, RequestOutput, TokenDelta
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.scheduler import Scheduler, StepOutput
from langchain_ascend.engine.detokenizer import IncrementalDetokenizer
from langchain_ascend.errors import (
    EngineClosedError,
    EngineStepError,
    InvalidRequestError,
    PromptTooLongError,
    RequestAbortedError,
)

logger = logging.getLogger(__name__)

_Item = TokenDelta | BaseException


class _ThreadSink:
    """Delivers to a thread blocked on a ``queue.Queue``."""

    def __init__(self) -> None:
        self.queue: queue.Queue[_Item] = queue.Queue()

    def put(self, item: _Item) -> bool:
        self.queue.put(item)
        return True


class _AsyncSink:
    """Delivers to a coroutine awaiting an ``asyncio.Queue`` on its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()

    def put(self, item: _Item) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            return False
        return True


@dataclass
class _Tracked:
    """A live request together with where its output goes."""

    request: Request
    sink: _ThreadSink | _AsyncSink
    detokenizer: IncrementalDetokenizer | _LazyText
    stream: bool


class LLMEngine:
    """A Hugging Face causal LM served with a paged KV cache, prefix caching and continuous
    batching.

    All public methods are thread-safe; ``agenerate``/``astream`` never block the event loop
    for longer than a lock hand-over.

    Args:
        model_path: Folder with the model and its tokenizer.
        device: ``"auto"``, ``"npu"``, ``"cuda:0"``, ``"cpu"``...
        dtype: ``"auto"`` or a dtype name.
        max_context_length: Most tokens (prompt + generated) per request; default the model's
            ``max_position_embeddings``.
        block_size: Tokens per KV block; default chosen by the attention backend.
        num_blocks: KV blocks; default sized from ``kv_cache_memory_fraction``.
        kv_cache_memory_fraction: Share of free device memory for the KV cache.
        enable_prefix_caching: Reuse the K/V of shared prompt prefixes across requests.
        max_batch_size: Most requests in one step.
        max_num_batched_tokens: Token budget of one step; longer prompts are prefilled in
            chunks.
        compile: ``"auto"``, True or False: compile the decode step.

    Example:
        >>> engine = LLMEngine(path, device="cpu")  # doctest: +SKIP
        >>> out = engine.generate(engine.tokenizer.encode("Hi"), SamplingParams(max_tokens=8))
        >>> out.finish_reason, out.stats.num_generated_tokens  # doctest: +SKIP
        ('length', 8)
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: Any = "auto",
        dtype: Any = "auto",
        max_context_length: int | None = None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        kv_cache_memory_fraction: float = 0.5,
        enable_prefix_caching: bool = True,
        max_batch_size: int = 64,
        max_num_batched_tokens: int = 2048,
        compile: bool | str = "auto",
    ) -> None:
        from transformers import AutoTokenizer

        from langchain_ascend.engine.worker.model_runner import ModelRunner
        from langchain_ascend.platform import resolve_device

        _check_positive(max_batch_size=max_batch_size,
                        max_num_batched_tokens=max_num_batched_tokens,
                        block_size=block_size, num_blocks=num_blocks,
                        max_context_length=max_context_length)
        resolve_device(device)  # an unusable device fails here, before anything loads
        path = os.fspath(model_path)
        runner = ModelRunner.load(
            path, device=str(device), dtype=_dtype_name(dtype), block_size=block_size,
            num_blocks=num_blocks, kv_cache_memory_fraction=kv_cache_memory_fraction,
            max_num_batched_tokens=max_num_batched_tokens, max_batch_size=max_batch_size,
            compile=compile,
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
        self._setup(
            runner, tokenizer, model_path=path,
            eos_token_ids=default_eos_token_ids(path, runner.config, tokenizer),
            max_context_length=max_context_length, enable_prefix_caching=enable_prefix_caching,
            max_batch_size=max_batch_size, max_num_batched_tokens=max_num_batched_tokens,
        )

    @classmethod
    def from_runner(
        cls,
        runner: Any,
        tokenizer: Any,
        *,
        model_path: str = "",
        eos_token_ids: Iterable[int] | None = None,
        max_context_length: int | None = None,
        enable_prefix_caching: bool = True,
        max_batch_size: int = 64,
        max_num_batched_tokens: int = 2048,
    ) -> LLMEngine:
        """An engine over an already loaded model runner (anything with the ModelRunner
        interface: ``block_size``, ``num_blocks``, ``max_model_len``, ``config``, ``device``,
        ``dtype``, ``execute``, ``release``, ``warmup``)."""
        _check_positive(max_batch_size=max_batch_size,
                        max_num_batched_tokens=max_num_batched_tokens,
                        max_context_length=max_context_length)
        engine = cls.__new__(cls)
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        engine._setup(
            runner, tokenizer, model_path=model_path, eos_token_ids=eos_token_ids,
            max_context_length=max_context_length, enable_prefix_caching=enable_prefix_caching,
            max_batch_size=max_batch_size, max_num_batched_tokens=max_num_batched_tokens,
        )
        return engine

    def _setup(
        self,
        runner: Any,
        tokenizer: Any,
        *,
        model_path: str,
        eos_token_ids: Iterable[int],
        max_context_length: int | None,
        enable_prefix_caching: bool,
        max_batch_size: int,
        max_num_batched_tokens: int,
    ) -> None:
        model_max = int(runner.max_model_len)
        if max_context_length is None:
            max_context_length = model_max
        elif max_context_length > model_max:
            raise InvalidRequestError(
                f"max_context_length={max_context_length} exceeds the model's "
                f"max_position_embeddings={model_max}")
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.device = runner.device
        self.dtype = runner.dtype
        self.max_context_length = max_context_length
        self.eos_token_ids: list[int] = list(dict.fromkeys(int(t) for t in eos_token_ids))
        self.block_size = int(runner.block_size)
        self.num_blocks = int(runner.num_blocks)
        self.vocab_size = _vocab_size(runner.config)
        self._runner = runner
        self._kv = KVCacheManager(self.num_blocks, self.block_size,
                                  enable_prefix_caching=enable_prefix_caching,
                                  relocate=getattr(runner, "copy_block", None))
        self._scheduler = Scheduler(
            self._kv, max_num_batched_tokens=max_num_batched_tokens,
            max_batch_size=max_batch_size,
            max_model_len=min(max_context_length, self._kv.capacity_tokens),
        )
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._runner_lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._thread: threading.Thread | None = None
        # The thread running steps now (the loop thread or a caller in generate()), if any.
        self._driver: threading.Thread | None = None
        self._callers_drive = getattr(self.device, "type", None) == "cpu"
        self._closed = False
        self._close_reason = ""
        self._engine_kwargs: dict[str, Any] = {}
        self._pending_aborts: collections.deque[Request] = collections.deque()
        _LIVE_ENGINES.add(self)

    # ----------------------------------------------------------------- public API

    @property
    def is_closed(self) -> bool:
        return self._closed

    def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> RequestOutput:
        """Run one request to completion, blocking the calling thread.

        Raises:
            InvalidRequestError / PromptTooLongError: Bad input (raised before anything runs).
            RequestAbortedError: Someone called :meth:`abort` on it.
            EngineStepError: A model step with this request failed.
            EngineClosedError: The engine was shut down or its loop died.
        """
        sink = _ThreadSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=False,
                               caller_drives=self._callers_drive)
        done = False
        try:
            while True:
                item = self._next_item(sink)
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.finished:
                    done = True
                    assert item.output is not None
                    return item.output
        finally:
            if not done:
                self._abort_own(request)

    def stream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> SyncTokenStream:
        """Submit now and iterate the request's :class:`TokenDelta` s as they come.

        Closing the iterator (``close()``, leaving a ``with`` block, or dropping it) aborts the
        request and frees its blocks. Errors as for :meth:`generate`, bad input raised here.
        """
        sink = _ThreadSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True)
        return SyncTokenStream(self, request, sink)

    async def agenerate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> RequestOutput:
        """Like :meth:`generate` for coroutines; cancelling the task aborts the request."""
        sink = _AsyncSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=False)
        while True:
            delta = await self._receive(request, sink)
            if delta.finished:
                assert delta.output is not None
                return delta.output

    async def astream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Async iterator of the request's deltas; closing it or cancelling the task that
        consumes it aborts the request and frees its blocks."""
        sink = _AsyncSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True)
        try:
            while True:
                delta = await self._receive(request, sink)
                yield delta
                if delta.finished:
                    return
        finally:  # closed early: abort (a no-op once the request finished or failed)
            self._abort_own(request)

    async def _receive(self, request: Request, sink: _AsyncSink) -> TokenDelta:
        """The request's next delta; a failure item is raised, and a cancelled wait aborts
        the request."""
        try:
            item = await sink.queue.get()
        except BaseException:
            self._abort_own(request)
            raise
        if isinstance(item, BaseException):
            raise item
        return item

    def abort(self, request_id: str) -> None:
        """Abort a live request now: its blocks are freed before this returns and its caller
        gets :class:`RequestAbortedError`. Unknown or finished ids are ignored."""
        with self._lock:
            tracked = self._tracked.get(request_id)
            if tracked is not None:
                self._abort_locked(tracked)
                tracked.sink.put(RequestAbortedError(f"request {request_id!r} was aborted"))

    def stats(self) -> EngineStats:
        """A consistent snapshot of the engine-wide counters."""
        with self._lock:
            pool = self._kv.pool
            return EngineStats(
                num_blocks_total=pool.num_blocks,
                num_blocks_used=pool.num_used_blocks,
                num_blocks_free=pool.num_free_blocks,
                num_blocks_cached=pool.num_cached_blocks,
                prefix_cache_queries=self._kv.num_queried_tokens,
                prefix_cache_hits=self._kv.num_hit_tokens,
                num_running=len(self._scheduler.running),
                num_waiting=len(self._scheduler.waiting),
                num_preemptions=self._scheduler.num_preemptions,
                num_steps=self._scheduler.num_steps,
            )

    def warmup(self) -> None:
        """Run the model runner's warm-up (compilation, first-call allocations)."""
        if self._closed:
            raise EngineClosedError(self._closed_message())
        with self._runner_lock:
            self._runner.warmup()

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; False (nothing done) while requests hold blocks."""
        with self._lock:
            return self._kv.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the loop, fail every live request with :class:`EngineClosedError` and drop
        the model. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_reason = "the engine was shut down"
                self._fail_all_locked(EngineClosedError(self._closed_message()))
            self._work.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        _forget_engine(self)
        _LIVE_ENGINES.discard(self)
        with self._runner_lock:
            self._runner = None

    # ----------------------------------------------------------------- submission

    def _submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None,
        request_id: str | None,
        sink: _ThreadSink | _AsyncSink,
        *,
        stream: bool,
        caller_drives: bool = False,
    ) -> Request:
        params = SamplingParams() if params is None else params
        prompt = self._validate(prompt_token_ids, params)
        rid = uuid.uuid4().hex if request_id is None else request_id
        if not isinstance(rid, str) or not rid:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {rid!r}")
        request = Request(rid, prompt, params, eos_token_ids=self.eos_token_ids,
                          arrival_time=time.monotonic())
        incremental = stream or bool(params.stop)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop) if incremental else None
        with self._lock:
            if self._closed:
                raise EngineClosedError(self._closed_message())
            if rid in self._tracked:
                raise InvalidRequestError(f"request_id {rid!r} is already in flight")
            self._scheduler.add_request(request)
            self._tracked[rid] = _Tracked(request, sink, detok or _LazyText(self.tokenizer),
                                          stream)
            if not caller_drives:  # else the caller drives, or the current driver serves it
                self._ensure_loop_locked()
                self._work.notify()
        return request

    def _validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(
                f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()
        if any(isinstance(t, bool) or not isinstance(t, int) for t in params.stop_token_ids):
            raise InvalidRequestError(
                f"stop_token_ids must be ints, got {params.stop_token_ids!r}")
        if isinstance(prompt_token_ids, (str, bytes)):
            raise InvalidRequestError("prompt_token_ids must be token ids; tokenize the text "
                                      "first (engine.tokenizer.encode)")
        if isinstance(prompt_token_ids, Mapping):
            raise InvalidRequestError("prompt_token_ids must be a list of token ids, got a "
                                      "mapping; pass its 'input_ids' list")
        try:
            prompt = [int(t) for t in prompt_token_ids]
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"prompt_token_ids must be a list of ints: {exc}") from None
        if not prompt:
            raise InvalidRequestError("the prompt is empty: give at least one token id")
        if self.vocab_size is not None:
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) > self.max_context_length:
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens, more than max_context_length="
                f"{self.max_context_length}")
        if len(prompt) > self._kv.capacity_tokens:
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens, more than the whole KV cache holds "
                f"({self.num_blocks} blocks x {self.block_size} = {self._kv.capacity_tokens}); "
                "raise num_blocks or kv_cache_memory_fraction")
        return prompt

    # ----------------------------------------------------------------- abort / failure

    def _abort_own(self, request: Request) -> None:
        """Abort a request its own caller gave up on (closed stream, cancelled task...).

        Safe from a finalizer: when the lock is taken (possibly by this very thread, which a
        garbage collection can interrupt anywhere), the abort is queued for the loop instead.
        """
        if not self._lock.acquire(blocking=False):
            self._pending_aborts.append(request)
            return
        try:
            tracked = self._tracked.get(request.request_id)
            if tracked is not None and tracked.request is request:
                self._abort_locked(tracked)
        finally:
            self._lock.release()

    def _abort_locked(self, tracked: _Tracked) -> None:
        self._tracked.pop(tracked.request.request_id, None)
        self._scheduler.abort_request(tracked.request.request_id)
        self._work.notify()

    def _drain_pending_aborts_locked(self) -> None:
        while self._pending_aborts:
            request = self._pending_aborts.popleft()
            tracked = self._tracked.get(request.request_id)
            if tracked is not None and tracked.request is request:
                self._abort_locked(tracked)

    def _fail_locked(self, tracked: _Tracked, error: BaseException) -> None:
        rid = tracked.request.request_id
        self._tracked.pop(rid, None)
        if not tracked.request.is_finished:
            self._scheduler.finish_request(tracked.request, RequestStatus.FINISHED_ABORTED)
        tracked.sink.put(error)

    def _fail_all_locked(self, error: BaseException) -> None:
        for tracked in list(self._tracked.values()):
            own = type(error)(*error.args)  # one instance per caller: tracebacks differ
            own.__cause__ = error.__cause__
            self._fail_locked(tracked, own)

    def _closed_message(self) -> str:
        return f"the engine is closed: {self._close_reason}"

    # ----------------------------------------------------------------- the loop

    def _ensure_loop_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="langchain-ascend-engine",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        try:
            while self._run_one_iteration():
                pass
        except BaseException as exc:  # noqa: BLE001 - the loop must report, not vanish
            self._close_after_crash(exc)

    def _close_after_crash(self, exc: BaseException) -> None:
        """A driver failed outside a model step (a bookkeeping bug): the engine's state can
        no longer be trusted, so close it and fail every live request."""
        logger.exception("engine loop died", exc_info=exc)
        with self._lock:
            self._driver = None
            self._closed = True
            self._close_reason = f"the engine loop died: {type(exc).__name__}: {exc}"
            error = EngineClosedError(self._closed_message())
            error.__cause__ = exc
            self._fail_all_locked(error)

    def _run_one_iteration(self) -> bool:
        """Loop thread: wait until there is work and nobody else drives, run one step.

        False when the loop should end: the engine closed, or (where callers drive) it ran out
        of work, so the thread and its OpenMP pool go away.
        """
        me = threading.current_thread()
        with self._lock:
            while True:
                if self._closed:
                    if self._driver is me:
                        self._driver = None
                    return False
                if self._driver is None or self._driver is me:
                    work = self._next_batch_locked()
                    if work is not None:
                        self._driver = me
                        break
                    self._driver = None
                    if self._callers_drive:
                        if self._thread is me:
                            self._thread = None
                        return False
                self._work.wait()
        self._run_batch(*work)
        return True

    def _next_item(self, sink: _ThreadSink) -> _Item:
        """The next item for a thread blocked in :meth:`generate`; on the CPU the thread runs
        the steps itself while no other thread does (see the module docstring)."""
        while True:
            try:
                return sink.queue.get_nowait()
            except queue.Empty:
                pass
            if not self._drive_until_item(sink):
                return sink.queue.get()  # another thread drives (or nothing is left to run)

    def _drive_until_item(self, sink: _ThreadSink) -> bool:
        """Run steps on this thread until ``sink`` has an item; whether it has one. False
        at once when another thread drives, which then serves this request too."""
        me = threading.current_thread()
        with self._lock:
            if not self._callers_drive or self._driver is not None or self._closed:
                return False
            self._driver = me
        try:
            while sink.queue.empty():
                with self._lock:
                    if self._closed:
                        break
                    work = self._next_batch_locked()
                if work is None:
                    break
                try:
                    self._run_batch(*work)
                except Exception as exc:  # noqa: BLE001 - as fatal as in the loop thread
                    self._close_after_crash(exc)
                    break
                except BaseException:  # interrupted (KeyboardInterrupt...): the step never
                    with self._lock:    # ran for the others, who are scheduled again
                        self._scheduler.discard_scheduled()
                    raise
        finally:
            with self._lock:
                self._driver = None
                finished_ids = [] if self._closed else self._scheduler.take_finished_ids()
                if not self._closed and self._scheduler.has_unfinished_requests():
                    self._ensure_loop_locked()  # hand the other requests to the loop thread
                self._work.notify_all()
            self._release(finished_ids)
        return not sink.queue.empty()

    def _next_batch_locked(self) -> tuple[ScheduledBatch, bool] | None:
        """The next step to run and whether it is only a release of finished requests; None
        when there is nothing to do."""
        self._drain_pending_aborts_locked()
        if self._scheduler.has_unfinished_requests():
            return self._scheduler.schedule(), False
        finished_ids = self._scheduler.take_finished_ids()
        if finished_ids:  # idle: only let the runner drop their state
            return ScheduledBatch(finished_ids=finished_ids), True
        return None

    def _run_batch(self, batch: ScheduledBatch, idle: bool) -> None:
        """Run one scheduled step and deliver its results (any driver)."""
        self._release(batch.finished_ids)
        if not batch.segments:
            if not idle:
                # Cannot happen by the scheduler's design (a request alone always fits).
                logger.warning("engine step scheduled nothing with %d requests waiting",
                               len(self._scheduler.waiting))
                with self._lock:
                    self._work.wait(0.01)
            return
        try:
            with self._runner_lock:
                if self._runner is None:
                    return
                sampled = list(self._runner.execute(batch))
            if len(sampled) != len(batch.segments):
                raise RuntimeError(f"model runner returned {len(sampled)} results for "
                                   f"{len(batch.segments)} segments")
        except Exception as exc:  # noqa: BLE001 - fail this step's requests, keep serving
            logger.exception("engine step failed")
            with self._lock:
                self._fail_step_locked(batch.segments, exc)
            return
        with self._lock:
            outputs = self._scheduler.update(batch, sampled)
            self._deliver_locked(outputs)

    def _release(self, request_ids: list[str]) -> None:
        if request_ids:
            with self._runner_lock:
                if self._runner is not None:
                    self._runner.release(request_ids)

    def _fail_step_locked(self, segments: Sequence[Any], exc: Exception) -> None:
        scheduled = self._scheduler.discard_scheduled()
        for segment in segments:
            tracked = self._tracked.get(segment.request_id)
            if tracked is None or tracked.request is not scheduled.get(segment.request_id):
                continue  # aborted while the step ran (its id may already be reused)
            error = EngineStepError(f"the model step for request {segment.request_id!r} failed: "
                                    f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._fail_locked(tracked, error)

    # ----------------------------------------------------------------- delivery

    def _deliver_locked(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            tracked = self._tracked.get(out.request.request_id)
            if tracked is None or tracked.request is not out.request:
                continue
            try:
                delivered = self._deliver_one_locked(tracked, out)
            except Exception as exc:  # noqa: BLE001 - one request's failure stays its own
                logger.exception("delivering output of request %s failed",
                                 out.request.request_id)
                error = EngineStepError(f"producing the output of request "
                                        f"{out.request.request_id!r} failed: {exc}")
                error.__cause__ = exc
                self._fail_locked(tracked, error)
                continue
            if not delivered:  # the caller's event loop is gone
                self._tracked.pop(out.request.request_id, None)
                if not out.request.is_finished:
                    self._scheduler.finish_request(out.request, RequestStatus.FINISHED_ABORTED)

    def _deliver_one_locked(self, tracked: _Tracked, out: StepOutput) -> bool:
        request = out.request
        hidden = out.finished and request.last_token_hidden
        new_ids = [] if hidden else [out.new_token_id]
        detok = tracked.detokenizer
        if new_ids:
            detok.add_token(out.new_token_id)
        if detok.stop_string is not None:
            if not request.is_finished:
                self._scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED,
                                               stop_reason=detok.stop_string)
            else:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = detok.stop_string
        if not request.is_finished:
            if not tracked.stream:
                return True
            return tracked.sink.put(TokenDelta(request.request_id, new_ids, detok.take_delta()))
        self._tracked.pop(request.request_id, None)
        detok.finish()
        text = detok.take_delta(final=True)
        output = RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.returned_token_ids,
            text=detok.text,
            finish_reason=request.status.finish_reason or "stop",
            stop_reason=request.stop_reason,
            stats=request.stats(),
        )
        return tracked.sink.put(TokenDelta(
            request.request_id, new_ids, text, finished=True,
            finish_reason=output.finish_reason, output=output))


class _LazyText:
    """Detokenizer stand-in for requests that neither stream nor have stop strings: decode
    once at the end."""

    stop_string = None

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self.text = ""
        self._taken = False

    def add_token(self, token_id: int) -> None:
        self._ids.append(token_id)

    def finish(self) -> None:
        self.text = self._tokenizer.decode(self._ids, skip_special_tokens=True)

    def take_delta(self, *, final: bool = False) -> str:
        if not final or self._taken:
            return ""
        self._taken = True
        return self.text


class SyncTokenStream(Iterator[TokenDelta]):
    """Iterator over one request's deltas; closing it (or dropping it) aborts the request."""

    def __init__(self, engine: LLMEngine, request: Request, sink: _ThreadSink) -> None:
        self.request_id = request.request_id
        self._request = request
        self._engine: LLMEngine | None = engine
        self._sink = sink

    def __iter__(self) -> SyncTokenStream:
        return self

    def __next__(self) -> TokenDelta:
        if self._engine is None:
            raise StopIteration
        try:
            item = self._sink.queue.get()
        except BaseException:
            self.close()
            raise
        if isinstance(item, BaseException):
            self._engine = None
            raise item
        if item.finished:
            self._engine = None
        return item

    def close(self) -> None:
        """Abort the request if it is still running."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine._abort_own(self._request)

    def __enter__(self) -> SyncTokenStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


# --------------------------------------------------------------------- helpers


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")


def _dtype_name(dtype: Any) -> str:
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")


def _vocab_size(config: Any) -> int | None:
    size = getattr(config, "vocab_size", None)
    if size is None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    return int(size) if size else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def default_eos_token_ids(model_path: str, config: Any, tokenizer: Any) -> list[int]:
    """EOS ids of a model: ``generation_config.json``'s ``eos_token_id`` (int or list; the
    model config's when that file is missing) plus the tokenizer's EOS token."""
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        ids += _as_id_list(GenerationConfig.from_pretrained(model_path).eos_token_id)
    except (OSError, ValueError):
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        ids += _as_id_list(getattr(text_config, "eos_token_id", None))
    ids += _as_id_list(getattr(tokenizer, "eos_token_id", None))
    return list(dict.fromkeys(ids))


# --------------------------------------------------------------------- registry

# Engines whose loop may be running: stopped at interpreter exit so no model step is cut off
# half-way while the interpreter tears down.
_LIVE_ENGINES: weakref.WeakSet[LLMEngine] = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("engine shutdown at exit failed", exc_info=True)

_REGISTRY: dict[tuple[str, str, str], LLMEngine] = {}
_REGISTRY_LOCK = threading.Lock()


def get_engine(
    model_path: str | os.PathLike[str], *, device: Any = "auto", dtype: Any = "auto",
    **engine_kwargs: Any,
) -> LLMEngine:
    """The process-wide engine for ``(realpath(model_path), device, dtype)``, created on first
    use so every chat model on the same weights shares one KV cache and one batch.

    ``engine_kwargs`` (see :class:`LLMEngine`) apply when the engine is created; a later call
    with different ones gets the existing engine (a warning is logged).
    """
    from langchain_ascend.platform import resolve_device, resolve_dtype

    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    key = (os.path.realpath(os.fspath(model_path)), str(resolved_device),
           str(resolved_dtype).removeprefix("torch."))
    with _REGISTRY_LOCK:
        engine = _REGISTRY.get(key)
        if engine is not None and not engine.is_closed:
            if engine_kwargs and engine_kwargs != engine._engine_kwargs:
                logger.warning("get_engine(%s): an engine already exists; ignoring the new "
                               "engine_kwargs %s", key[0], engine_kwargs)
            return engine
        engine = LLMEngine(key[0], device=key[1], dtype=key[2], **engine_kwargs)
        engine._engine_kwargs = dict(engine_kwargs)
        _REGISTRY[key] = engine
        return engine


def _forget_engine(engine: LLMEngine) -> None:
    with _REGISTRY_LOCK:
        for key, value in list(_REGISTRY.items()):
            if value is engine:
                del _REGISTRY[key]
