"""LLMEngine: one model, one paged KV cache, one batch shared by every caller.

Threads and asyncio tasks submit token-id requests (validated here, before anything runs);
requests join and leave the running batch at every step. Each request's output goes back
through its own sink (``streams``): a ``queue.Queue`` for threads, an ``asyncio.Queue`` fed
through ``loop.call_soon_threadsafe`` for coroutines. The engine holds its
:class:`~langchain_ascend.engine.driver.EngineDriver` (scheduler, model runner, step loop);
``loader`` turns a model folder into what the driver runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from langchain_ascend.engine import hf_config
from langchain_ascend.engine.core.outputs import EngineStats, RequestOutput, TokenDelta
from langchain_ascend.engine.core.request import Request
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.detokenizer import (
    IncrementalDetokenizer,
    TextDecoder,
    special_tokens_of,
)
from langchain_ascend.engine.driver import EngineDriver
from langchain_ascend.engine.loader import LoadedModel
from langchain_ascend.engine.request_faults import GuardedConstraint
from langchain_ascend.engine.streams import (
    AsyncSink,
    LazyText,
    SyncTokenStream,
    ThreadSink,
    Tracked,
)
from langchain_ascend.errors import InvalidRequestError, PromptTooLongError
from langchain_ascend.validation import check_count, check_flag, check_probability

__all__ = ["LLMEngine", "SyncTokenStream"]

class LLMEngine:
    """A Hugging Face causal LM served with a paged KV cache, prefix caching and continuous
    batching.

    All public methods are thread-safe; ``agenerate``/``astream`` never block the event loop
    for longer than a lock hand-over.

    Args:
        model_path: Folder with the model and its tokenizer (loaded by
            :meth:`LoadedModel.load <langchain_ascend.engine.loader.LoadedModel.load>`), or a
            :class:`~langchain_ascend.engine.loader.LoadedModel` (see :meth:`from_runner`; the
            loading settings ``device`` ... ``quantization`` then stay at their defaults).
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
        kv_cache_dtype: What the KV cache stores: ``"auto"`` (float16 for quantized weights
            on the CPU, llama.cpp's cache type; the model's dtype elsewhere), ``"float32"``,
            ``"bfloat16"`` or ``"float16"``. ``stats().weights["kv_cache_dtype"]`` says which.

    Example:
        >>> engine = LLMEngine(path, device="cpu")  # doctest: +SKIP
        >>> out = engine.generate(engine.tokenizer.encode("Hi"), SamplingParams(max_tokens=8))
        >>> out.finish_reason, out.stats.num_generated_tokens  # doctest: +SKIP
        ('length', 8)
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | LoadedModel,
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
        kv_cache_dtype: str | None = "auto",
        scheduling: str = "fcfs",
        session_retention: bool = True,
        retention_cap: float = 0.5,
    ) -> None:
        loading = {"device": device, "dtype": dtype, "block_size": block_size,
                   "num_blocks": num_blocks, "kv_cache_memory_fraction": kv_cache_memory_fraction,
                   "compile": compile, "quantization": quantization,
                   "kv_cache_dtype": kv_cache_dtype}
        _check_settings(max_batch_size=max_batch_size,
                        max_num_batched_tokens=max_num_batched_tokens,
                        stream_buffer_limit=stream_buffer_limit,
                        max_context_length=max_context_length, block_size=block_size,
                        num_blocks=num_blocks, kv_cache_memory_fraction=kv_cache_memory_fraction,
                        enable_prefix_caching=enable_prefix_caching)
        if isinstance(model_path, LoadedModel):
            _check_loaded_defaults(loading)
            model = model_path
        else:
            model = LoadedModel.load(model_path, **loading, max_batch_size=max_batch_size,
                                     max_num_batched_tokens=max_num_batched_tokens,
                                     max_context_length=max_context_length)
        runner, tokenizer = model.runner, model.tokenizer
        self.model_path = model.model_path
        self.tokenizer = tokenizer
        self.special_token_ids = frozenset(special_tokens_of(tokenizer).values())
        self.device = runner.device
        self.dtype = runner.dtype
        self.max_context_length = _context_length(max_context_length, int(runner.max_model_len))
        self.eos_token_ids: list[int] = list(dict.fromkeys(int(t) for t in model.eos_token_ids))
        self.block_size = int(runner.block_size)
        self.num_blocks = int(runner.num_blocks)
        self.vocab_size = hf_config.vocab_size(runner.config)
        self.driver = EngineDriver(
            runner, max_context_length=self.max_context_length,
            enable_prefix_caching=enable_prefix_caching, max_batch_size=max_batch_size,
            max_num_batched_tokens=max_num_batched_tokens,
            stream_buffer_limit=stream_buffer_limit, scheduling=scheduling,
            session_retention=session_retention, retention_cap=retention_cap)

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
        scheduling: str = "fcfs",
        session_retention: bool = True,
        retention_cap: float = 0.5,
    ) -> LLMEngine:
        """An engine over an already loaded model runner (anything with the ModelRunner
        interface: ``block_size``, ``num_blocks``, ``max_model_len``, ``config``, ``device``,
        ``dtype``, ``execute``, ``release``, ``warmup``); EOS ids default to the
        tokenizer's."""
        model = LoadedModel.by_hand(runner, tokenizer, model_path=model_path,
                                    eos_token_ids=eos_token_ids)
        return cls(model, max_context_length=max_context_length,
                   enable_prefix_caching=enable_prefix_caching, max_batch_size=max_batch_size,
                   max_num_batched_tokens=max_num_batched_tokens,
                   stream_buffer_limit=stream_buffer_limit, scheduling=scheduling,
                   session_retention=session_retention, retention_cap=retention_cap)

    # ----------------------------------------------------------------- public API

    @property
    def is_closed(self) -> bool:
        return self.driver.is_closed

    def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None, *, session_id: str | None = None,
    ) -> RequestOutput:
        """Run one request to completion, blocking the calling thread (``session_id``: the
        agent session it belongs to, see the class docstring).

        Raises:
            InvalidRequestError / PromptTooLongError: Bad input (raised before anything runs).
            RequestAbortedError: Someone called :meth:`abort` on it.
            EngineStepError: A model step with this request failed.
            EngineClosedError: The engine was shut down or its loop died.
        """
        sink = ThreadSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=False,
                               caller_drives=self.driver.callers_drive,
                               session_id=session_id)
        done = False
        try:
            while True:
                item = self.driver.next_item(sink)
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.finished:
                    done = True
                    assert item.output is not None
                    return item.output
        finally:
            if not done:
                self.driver.abort_own(request)

    def stream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None, *, session_id: str | None = None,
    ) -> SyncTokenStream:
        """Submit now and iterate the request's :class:`TokenDelta` s as they come.

        Closing the iterator (``close()``, leaving a ``with`` block, or dropping it) aborts the
        request and frees its blocks. Errors as for :meth:`generate`, bad input raised here.
        """
        sink = ThreadSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True,
                               session_id=session_id)
        return SyncTokenStream(request.request_id, sink,
                               functools.partial(self.driver.abort_own, request))

    async def agenerate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None, *, session_id: str | None = None,
    ) -> RequestOutput:
        """Like :meth:`generate` for coroutines; cancelling the task aborts the request."""
        sink = AsyncSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=False,
                               session_id=session_id)
        while True:
            delta = await self._receive(request, sink)
            if delta.finished:
                assert delta.output is not None
                return delta.output

    async def astream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
        request_id: str | None = None, *, session_id: str | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Async iterator of the request's deltas; closing it or cancelling the task that
        consumes it aborts the request and frees its blocks."""
        sink = AsyncSink()
        request = self._submit(prompt_token_ids, params, request_id, sink, stream=True,
                               session_id=session_id)
        try:
            while True:
                delta = await self._receive(request, sink)
                yield delta
                if delta.finished:
                    return
        finally:  # closed early: abort (a no-op once the request finished or failed)
            self.driver.abort_own(request)

    async def _receive(self, request: Request, sink: AsyncSink) -> TokenDelta:
        """The request's next delta; a failure item is raised, and a cancelled wait aborts
        the request."""
        try:
            item = await sink.queue.get()
        except BaseException:
            self.driver.abort_own(request)
            raise
        sink.num_taken += 1
        if isinstance(item, BaseException):
            raise item
        return item

    def abort(self, request_id: str) -> None:
        """Abort a live request now: its blocks are freed before this returns and its caller
        gets :class:`RequestAbortedError`. Unknown or finished ids are ignored."""
        self.driver.abort(request_id)

    def stats(self) -> EngineStats:
        """A consistent snapshot of the engine-wide counters."""
        return self.driver.stats()

    # ----------------------------------------------------------------- sessions

    def park_session(self, session_id: str, tool_names: Sequence[str] = (), *,
                     ttl_s: float | None = None) -> float | None:
        """Keep the session's blocks resident while its tools run (its last request ended
        in tool calls): soft (reclaimable at once under pressure), capped, released at the
        TTL, ``ttl_s`` or the one estimated from ``tool_names``' measured latency. Returns
        the TTL, or None when nothing was parked (retention off, unknown session)."""
        _check_session_id(session_id)
        return self.driver.park_session(session_id, tuple(tool_names), ttl_s)

    def release_session(self, session_id: str) -> bool:
        """Stop retaining a session's blocks (its run ended); they stay in the LRU cache."""
        _check_session_id(session_id)
        return self.driver.release_session(session_id)

    def record_tool_latency(self, name: str, seconds: float) -> None:
        """One measured latency of tool ``name`` (its TTL estimate learns from it)."""
        with self.driver.lock:
            self.driver.kv.pool.retention.latency.record(str(name), float(seconds))

    def note_template_fallback(self) -> None:
        """Count a hop whose results were prefilled one-shot (template not prefix-stable)."""
        with self.driver.lock:
            self.driver.kv.session_counters.num_template_fallbacks += 1

    def take_background_spans(self, session_id: str) -> list[tuple[float, float, int]]:
        """The session's background prefills finished since the last call: ``(start, end,
        tokens computed)``, ``time.monotonic()`` readings (what ``AscendTimeline`` draws
        under the tool spans they overlapped)."""
        with self.driver.lock:
            return self.driver.scheduler.background_spans.pop(session_id, [])

    def prefill_session(self, session_id: str, prompt_token_ids: Sequence[int]) -> bool:
        """Prefill a parked session's known continuation in the background, at low priority
        (only while nothing else waits): its full blocks join the session's retained prefix,
        so the next hop computes only what is new. Exactness never depends on it: a hit is
        verified token by token, a wrong guess only costs compute. False when not queued
        (retention off, session not parked)."""
        _check_session_id(session_id)
        prompt = self._validate(prompt_token_ids, SamplingParams(max_tokens=1))
        request = Request(f"prefill-{uuid.uuid4().hex}", prompt, SamplingParams(max_tokens=1),
                          arrival_time=time.monotonic(), session_id=session_id,
                          prefill_only=True)
        return self.driver.submit_background(request)

    def warmup(self) -> None:
        """Run the model runner's warm-up (compilation, first-call allocations)."""
        self.driver.warmup()

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; False (nothing done) while requests hold blocks."""
        return self.driver.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the loop, fail every live request with :class:`EngineClosedError` and drop
        the model. Idempotent."""
        self.driver.shutdown()

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
        session_id: str | None = None,
    ) -> Request:
        params = SamplingParams() if params is None else params
        prompt = self._validate(prompt_token_ids, params)
        rid = uuid.uuid4().hex if request_id is None else request_id
        if not isinstance(rid, str) or not rid:
            raise InvalidRequestError(f"request_id must be a non-empty string, got {rid!r}")
        if params.constraint is not None:  # its failures stay its own (see engine.driver)
            params = dataclasses.replace(params, constraint=GuardedConstraint(params.constraint))
        if session_id is not None:
            _check_session_id(session_id)
        request = Request(rid, prompt, params, eos_token_ids=self.eos_token_ids,
                          arrival_time=time.monotonic(), session_id=session_id)
        incremental = stream or bool(params.stop)
        decode = TextDecoder(self.tokenizer, params.keep_special_token_ids,
                             self.special_token_ids)
        detok = IncrementalDetokenizer(decode, params.stop) if incremental else None
        self.driver.submit(Tracked(request, sink, detok or LazyText(decode), stream),
                           start_loop=not caller_drives)
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
        if len(prompt) > self.driver.kv.capacity_tokens:
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens, more than the whole KV cache holds "
                f"({self.num_blocks} blocks x {self.block_size} = {self.driver.kv.capacity_tokens}); "
                "raise num_blocks or kv_cache_memory_fraction")
        return prompt


def _check_session_id(session_id: Any) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise InvalidRequestError(f"session_id must be a non-empty string, got {session_id!r}")


def _context_length(requested: int | None, model_max: int) -> int:
    """The engine's context length: the model's unless a shorter one is asked for."""
    if requested is None:
        return model_max
    if requested > model_max:
        raise InvalidRequestError(
            f"max_context_length={requested} exceeds the model's "
            f"max_position_embeddings={model_max}")
    return requested


def _check_loaded_defaults(loading: dict[str, Any]) -> None:
    """A :class:`LoadedModel` is loaded already: the loading settings must be left alone."""
    defaults = inspect.signature(LLMEngine.__init__).parameters
    given = sorted(name for name, value in loading.items() if value != defaults[name].default)
    if given:
        raise InvalidRequestError(
            f"LLMEngine: {', '.join(given)} only apply when loading a model from a folder; "
            "the LoadedModel given is loaded already (set them when loading it)")


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
