"""LLMEngine: one model, one paged KV cache, one batch shared by every caller.

Threads and asyncio tasks submit token-id requests (validated here, before anything runs);
requests join and leave the running batch at every step. Each request's output goes back
through its own sink (``streams``): a ``queue.Queue`` for threads, an ``asyncio.Queue`` fed
through ``loop.call_soon_threadsafe`` for coroutines. Who runs the steps, and how their results
are delivered, is the ``driver``'s part.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from langchain_ascend import platform
from langchain_ascend.engine import hf_config, registry
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.outputs import EngineStats, RequestOutput, TokenDelta
from langchain_ascend.engine.core.request import Request
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.scheduler import Scheduler
from langchain_ascend.engine.detokenizer import (
    IncrementalDetokenizer,
    TextDecoder,
    special_tokens_of,
)
from langchain_ascend.engine.driver import EngineDriver, GuardedConstraint
from langchain_ascend.engine.streams import (
    AsyncSink,
    LazyText,
    SyncTokenStream,
    ThreadSink,
    Tracked,
)
from langchain_ascend.errors import (
    EngineClosedError,
    InvalidRequestError,
    PromptTooLongError,
    RequestAbortedError,
)
from langchain_ascend.validation import check_count, check_flag, check_probability

__all__ = ["LLMEngine", "SyncTokenStream"]

logger = logging.getLogger(__name__)


class LLMEngine(EngineDriver):
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
        num_blocks: KV blocks; default: enough for ``max_batch_size`` requests of
            ``max_context_length`` tokens, at most 256k tokens
            (``worker.kv_cache.DEFAULT_MAX_KV_TOKENS``) and at most
            ``kv_cache_memory_fraction`` of the free memory (see
            ``worker.kv_cache.plan_num_blocks``).
        kv_cache_memory_fraction: Most of the free device memory the default pool takes.
        enable_prefix_caching: Reuse the K/V of shared prompt prefixes across requests.
        max_batch_size: Most requests in one step.
        max_num_batched_tokens: Token budget of one step; longer prompts are prefilled in
            chunks.
        compile: How pure-decode steps run (``engine.worker.compile``): ``"auto"`` (graphs on
            CUDA / NPU; on the CPU the compiled step where ``warmup()`` measured it faster,
            see ``stats().decode_step``), True, ``"static"`` or False.
        stream_buffer_limit: Unread deltas after which a stream counts as abandoned: its
            request is aborted and its blocks freed (see ``engine.streams``).
        quantization: How the weights are held (``quant.load``): ``"auto"`` (the GGUF file's
            own blocks for a GGUF-backed folder, see ``resolve_model_source(...,
            quantization=)``; float otherwise), ``"gguf"``, ``"int8"`` / ``"int4"`` (every
            linear layer quantized at load), ``"none"`` / None. ``stats().weights`` says
            what was loaded.

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
        stream_buffer_limit: int = 1024,
        quantization: str | None = "auto",
    ) -> None:
        from transformers import AutoTokenizer

        from langchain_ascend.engine.worker.model_runner import ModelRunner

        _check_settings(max_batch_size=max_batch_size,
                        max_num_batched_tokens=max_num_batched_tokens,
                        stream_buffer_limit=stream_buffer_limit,
                        max_context_length=max_context_length, block_size=block_size,
                        num_blocks=num_blocks, kv_cache_memory_fraction=kv_cache_memory_fraction,
                        enable_prefix_caching=enable_prefix_caching)
        platform.resolve_device(device)  # an unusable device fails here, before anything loads
        path = os.fspath(model_path)
        if num_blocks is None:
            num_blocks = _default_num_blocks(
                path, device=device, dtype=dtype, block_size=block_size,
                memory_fraction=kv_cache_memory_fraction, max_batch_size=max_batch_size,
                max_context_length=max_context_length)
        runner = ModelRunner.load(
            path, device=str(device), dtype=_dtype_name(dtype), block_size=block_size,
            num_blocks=num_blocks, kv_cache_memory_fraction=kv_cache_memory_fraction,
            max_num_batched_tokens=max_num_batched_tokens, max_batch_size=max_batch_size,
            compile=compile, quantization=quantization,
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
        self._setup(
            runner, tokenizer, model_path=path,
            eos_token_ids=hf_config.default_eos_token_ids(path, runner.config, tokenizer),
            max_context_length=max_context_length, enable_prefix_caching=enable_prefix_caching,
            max_batch_size=max_batch_size, max_num_batched_tokens=max_num_batched_tokens,
            stream_buffer_limit=stream_buffer_limit,
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
        stream_buffer_limit: int = 1024,
    ) -> LLMEngine:
        """An engine over an already loaded model runner (anything with the ModelRunner
        interface: ``block_size``, ``num_blocks``, ``max_model_len``, ``config``, ``device``,
        ``dtype``, ``execute``, ``release``, ``warmup``)."""
        _check_settings(max_batch_size=max_batch_size,
                        max_num_batched_tokens=max_num_batched_tokens,
                        stream_buffer_limit=stream_buffer_limit,
                        max_context_length=max_context_length,
                        enable_prefix_caching=enable_prefix_caching)
        engine = cls.__new__(cls)
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        engine._setup(
            runner, tokenizer, model_path=model_path, eos_token_ids=eos_token_ids,
            max_context_length=max_context_length, enable_prefix_caching=enable_prefix_caching,
            max_batch_size=max_batch_size, max_num_batched_tokens=max_num_batched_tokens,
            stream_buffer_limit=stream_buffer_limit,
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
        stream_buffer_limit: int = 1024,
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
        self.special_token_ids = frozenset(special_tokens_of(tokenizer).values())
        self.device = runner.device
        self.dtype = runner.dtype
        self.max_context_length = max_context_length
        self.eos_token_ids: list[int] = list(dict.fromkeys(int(t) for t in eos_token_ids))
        self.block_size = int(runner.block_size)
        self.num_blocks = int(runner.num_blocks)
        self.vocab_size = hf_config.vocab_size(runner.config)
        self._runner = runner
        self._kv = KVCacheManager(self.num_blocks, self.block_size,
                                  enable_prefix_caching=enable_prefix_caching,
                                  relocate=getattr(runner, "copy_block", None))
        self._scheduler = Scheduler(
            self._kv, max_num_batched_tokens=max_num_batched_tokens,
            max_batch_size=max_batch_size,
            max_model_len=min(max_context_length, self._kv.capacity_tokens),
        )
        # Greedy identity with drafting holds where a pass of several rows rounds like a pass
        # of one: float32 float weights. In bfloat16/float16 the batched products round
        # differently and a near-tie can flip (measured on CPU bf16); with quantized weights
        # the activations are rounded to int8, which turns the verify pass's last-bit
        # attention differences into flips (measured on SmolLM2 gguf). So "auto" drafts only
        # there; "prompt_lookup" drafts in any dtype and format.
        quantized = bool(getattr(runner, "weights", {}).get("quantized_bytes"))
        self._scheduler.auto_drafting = str(self.dtype) == "torch.float32" and not quantized
        measure = getattr(runner, "measure_draft_row_cost", None)
        if measure is not None and self._scheduler.auto_drafting:
            self._scheduler.draft_row_cost = float(measure())
            logger.info("a drafted token's row costs %.2f of a decode pass on %s %s "
                        "(speculative_decoding='auto' drafts while acceptance beats it)",
                        self._scheduler.draft_row_cost, self.device, self.dtype)
        elif not self._scheduler.auto_drafting:
            logger.info("speculative_decoding='auto' does not draft in %s%s (multi-row passes "
                        "round differently from one-row passes); 'prompt_lookup' does",
                        self.dtype, " with quantized weights" if quantized else "")
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._runner_lock = threading.Lock()
        self._tracked = {}
        self._thread = None
        self._driver = None  # the loop thread or a caller in generate(), while it drives
        self._callers_drive = platform.callers_drive_steps(self.device)
        self._closed = False
        self._close_reason = ""
        self._engine_kwargs: dict[str, Any] = {}
        self._pending_aborts = collections.deque()
        self._stream_buffer_limit = stream_buffer_limit
        registry.track_live(self)

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
        sink = ThreadSink()
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
        sink = ThreadSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True)
        return SyncTokenStream(self, request, sink)

    async def agenerate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> RequestOutput:
        """Like :meth:`generate` for coroutines; cancelling the task aborts the request."""
        sink = AsyncSink()
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
        sink = AsyncSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True)
        try:
            while True:
                delta = await self._receive(request, sink)
                yield delta
                if delta.finished:
                    return
        finally:  # closed early: abort (a no-op once the request finished or failed)
            self._abort_own(request)

    async def _receive(self, request: Request, sink: AsyncSink) -> TokenDelta:
        """The request's next delta; a failure item is raised, and a cancelled wait aborts
        the request."""
        try:
            item = await sink.queue.get()
        except BaseException:
            self._abort_own(request)
            raise
        sink.num_taken += 1
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
                num_draft_tokens=self._scheduler.num_draft_tokens,
                num_accepted_tokens=self._scheduler.num_accepted_tokens,
                num_forced_tokens=self._scheduler.num_forced_tokens,
                decode_step=self._decode_step(),
                weights=dict(getattr(self._runner, "weights", None) or {}),
            )

    def _decode_step(self) -> dict[str, Any]:
        """The runner's step compiler's description (``StepCompiler.describe``), or {}."""
        describe = getattr(getattr(self._runner, "compiler", None), "describe", None)
        return describe() if callable(describe) else {}

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
        registry.forget_engine(self)
        with self._runner_lock:
            self._runner = None

    # ----------------------------------------------------------------- submission

    def _submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None,
        request_id: str | None,
        sink: ThreadSink | AsyncSink,
        *,
        stream: bool,
        caller_drives: bool = False,
    ) -> Request:
        params = SamplingParams() if params is None else params
        prompt = self._validate(prompt_token_ids, params)
        rid = uuid.uuid4().hex if request_id is None else request_id
        if not isinstance(rid, str) or not rid:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {rid!r}")
        if params.constraint is not None:  # its failures stay its own (see engine.driver)
            params = dataclasses.replace(params, constraint=GuardedConstraint(params.constraint))
        request = Request(rid, prompt, params, eos_token_ids=self.eos_token_ids,
                          arrival_time=time.monotonic())
        incremental = stream or bool(params.stop)
        decode = TextDecoder(self.tokenizer, params.keep_special_token_ids,
                             self.special_token_ids)
        detok = IncrementalDetokenizer(decode, params.stop) if incremental else None
        with self._lock:
            if self._closed:
                raise EngineClosedError(self._closed_message())
            if rid in self._tracked:
                raise InvalidRequestError(f"request_id {rid!r} is already in flight")
            self._scheduler.add_request(request)
            self._tracked[rid] = Tracked(request, sink, detok or LazyText(decode),
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



def _check_settings(*, max_batch_size: Any, max_num_batched_tokens: Any,
                    stream_buffer_limit: Any, max_context_length: Any = None,
                    block_size: Any = None, num_blocks: Any = None,
                    kv_cache_memory_fraction: Any = 0.5,
                    enable_prefix_caching: Any = True) -> None:
    """The engine's settings by the package's rules (:mod:`langchain_ascend.validation`):
    counts are integers >= 1, never ``True`` (None = the default where the setting has one),
    the memory fraction a finite number in (0, 1], prefix caching a flag.

    Raises:
        InvalidArgumentTypeError: A value of the wrong type (``max_batch_size=True``).
        InvalidRequestError: A value out of range (``num_blocks=0``).
    """
    for name, value in (("max_batch_size", max_batch_size),
                        ("max_num_batched_tokens", max_num_batched_tokens),
                        ("stream_buffer_limit", stream_buffer_limit)):
        check_count(name, value)
    for name, value in (("max_context_length", max_context_length),
                        ("block_size", block_size), ("num_blocks", num_blocks)):
        check_count(name, value, allow_none=True)
    check_probability("kv_cache_memory_fraction", kv_cache_memory_fraction, open_min=True)
    check_flag("enable_prefix_caching", enable_prefix_caching)


def _default_num_blocks(path: str, *, device: Any, dtype: Any, block_size: int | None,
                        memory_fraction: float, max_batch_size: int,
                        max_context_length: int | None) -> int:
    """The default pool of the model at ``path``: room for ``max_batch_size`` requests of the
    context length (the model's when not set), bounded by ``plan_num_blocks``'s caps."""
    from transformers import AutoConfig

    from langchain_ascend.attention.backends import backend_name_for, get_backend_class
    from langchain_ascend.engine.worker.kv_cache import plan_num_blocks

    config = AutoConfig.from_pretrained(path)
    num_layers, num_heads, num_kv_heads, head_dim = hf_config.attention_geometry(config)
    resolved_device = platform.resolve_device(device)
    resolved_dtype = platform.resolve_dtype(_dtype_name(dtype), resolved_device)
    backend_cls = get_backend_class(backend_name_for(platform.device_type(resolved_device),
                                                     "auto"))
    block_size = block_size or backend_cls.preferred_block_size()
    backend = backend_cls(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                          dtype=resolved_dtype, device=resolved_device)
    model_max = hf_config.max_position_embeddings(config)
    context = model_max if max_context_length is None else min(max_context_length, model_max)
    return plan_num_blocks(
        device=resolved_device, bytes_per_block=backend.bytes_per_block(block_size, num_layers),
        memory_fraction=memory_fraction, block_size=block_size,
        max_num_tokens=max_batch_size * context)


def _dtype_name(dtype: Any) -> str:
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")
