"""The engine's driver: the scheduler, the model runner and the step loop that joins them.

One thread at a time runs *schedule -> model step -> update* and hands each request's tokens
to its sink. A background loop thread (started on demand) serves coroutines and streams. Where
:func:`langchain_ascend.platform.callers_drive_steps` says so (the CPU), a thread blocked in
:meth:`~langchain_ascend.engine.llm_engine.LLMEngine.generate` drives the steps itself while
nobody else does, and the loop thread ends when it runs out of work, so the steps run on the
caller's OpenMP pool instead of a second one (see ``docs/performance.md``).

Fault isolation: a request's own callbacks inside a step run behind a
:class:`~langchain_ascend.engine.request_faults.GuardedConstraint`. The step then completes
for everyone: the forward already wrote every row's K/V, and each row's token depends only on
its own logits, so the other rows keep exactly the tokens they would have had without the
faulty request. The faulty request alone is failed with :class:`RequestFaultError` before the
step's results are applied (its row's token is discarded, its blocks freed). A step that fails
in a way no request owns (the forward itself) fails all of that step's requests with
:class:`EngineStepError`, and the engine keeps serving.

Locking: :attr:`EngineDriver.lock` guards the scheduler, the block pool and the per-request
state. A driving thread holds it while scheduling and while applying a step's results, never
while the model runs, so ``abort`` (and a closed stream or a cancelled task) frees a request's
blocks at once.
"""

from __future__ import annotations

import atexit
import collections
import logging
import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from langchain_ascend import platform
from langchain_ascend.engine.core.batch import ScheduledBatch
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.outputs import EngineStats, TokenDelta
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.retention import RetentionTable
from langchain_ascend.engine.core.scheduler import Scheduler, StepOutput
from langchain_ascend.engine.core.speculation import configure_drafting
from langchain_ascend.engine.hf_config import attention_cost_context
from langchain_ascend.engine.request_faults import fault_error, fault_of
from langchain_ascend.engine.streams import Item, ThreadSink, Tracked
from langchain_ascend.errors import (
    EngineClosedError,
    EngineStepError,
    InvalidRequestError,
    RequestAbortedError,
)

logger = logging.getLogger(__name__)

# Drivers whose loop may be running: stopped at interpreter exit so no model step is cut off
# half-way while the interpreter tears down.
_LIVE_DRIVERS: weakref.WeakSet[EngineDriver] = weakref.WeakSet()


@atexit.register
def _shutdown_live_drivers() -> None:
    for driver in list(_LIVE_DRIVERS):
        try:
            driver.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("engine shutdown at exit failed", exc_info=True)


class EngineDriver:
    """The scheduler (over a paged KV cache manager), the model runner and the step loop.

    Args:
        runner: The loaded model runner (see ``engine.loader.LoadedModel``).
        max_context_length: Most tokens (prompt + generated) per request.
        enable_prefix_caching: Reuse the K/V of shared prompt prefixes across requests.
        max_batch_size: Most requests in one step.
        max_num_batched_tokens: Token budget of one step.
        stream_buffer_limit: Unread deltas after which a stream counts as abandoned.
        scheduling, session_retention, retention_cap: As for ``LLMEngine``.

    Attributes:
        runner: The model runner (None once shut down); steps run under its own lock.
        kv: The KV cache manager (block pool, prefix cache).
        scheduler: Picks each step's requests.
        lock: Guards the scheduler, the block pool and the per-request state.
        callers_drive: Whether a thread in ``generate`` runs the steps itself (the CPU).
        thread: The loop thread while it runs.
    """

    def __init__(self, runner: Any, *, max_context_length: int, enable_prefix_caching: bool,
                 max_batch_size: int, max_num_batched_tokens: int,
                 stream_buffer_limit: int, scheduling: str = "fcfs",
                 session_retention: bool = True, retention_cap: float = 0.5) -> None:
        self.runner = runner
        self.kv = KVCacheManager(int(runner.num_blocks), int(runner.block_size),
                                 enable_prefix_caching=enable_prefix_caching,
                                 relocate=getattr(runner, "copy_block", None),
                                 retention=RetentionTable(retention_cap))
        self.scheduler = Scheduler(
            self.kv, max_num_batched_tokens=max_num_batched_tokens, max_batch_size=max_batch_size,
            max_model_len=min(max_context_length, self.kv.capacity_tokens), policy=scheduling,
            prefill_beside_decodes=platform.prefill_beside_decodes(runner.device),
            prefill_cost_context=attention_cost_context(  # charged by attention on the CPU
                getattr(runner, "config", None), platform.prefill_attention_slowdown(runner.device)))
        self.session_retention = session_retention
        self._background: dict[str, Request] = {}  # session -> its latest background prefill
        configure_drafting(self.scheduler, runner)
        self.lock = threading.Lock()
        self.callers_drive = platform.callers_drive_steps(runner.device)
        self.thread: threading.Thread | None = None
        self._work = threading.Condition(self.lock)
        self._runner_lock = threading.Lock()
        self._tracked: dict[str, Tracked] = {}
        self._stepping: threading.Thread | None = None  # the thread running steps now, if any
        self._closed = False
        self._close_reason = ""
        self._pending_aborts: collections.deque[Request] = collections.deque()
        self._stream_buffer_limit = stream_buffer_limit
        _LIVE_DRIVERS.add(self)

    # ----------------------------------------------------------------- the engine's calls

    @property
    def is_closed(self) -> bool:
        return self._closed

    def closed_message(self) -> str:
        return f"the engine is closed: {self._close_reason}"

    def submit(self, tracked: Tracked, *, start_loop: bool) -> None:
        """Schedule ``tracked``'s request; ``start_loop`` False where its caller drives.

        Raises:
            EngineClosedError: The engine is shut down or its loop died.
            InvalidRequestError: A live request already has this id.
        """
        rid = tracked.request.request_id
        with self.lock:
            if self._closed:
                raise EngineClosedError(self.closed_message())
            if rid in self._tracked:
                raise InvalidRequestError(f"request_id {rid!r} is already in flight")
            self.scheduler.add_request(tracked.request)
            self._tracked[rid] = tracked
            if start_loop:  # else the caller drives, or the current driver serves it
                self._ensure_loop_locked()
                self._work.notify()

    # ----------------------------------------------------------------- sessions

    def park_session(self, session_id: str, tool_names: Sequence[str] = (),
                     ttl_s: float | None = None) -> float | None:
        """Retain the session's last blocks while its tools run; the TTL given or None."""
        with self.lock:
            return (self.kv.park(session_id, tool_names=tool_names, ttl_s=ttl_s)
                    if self.session_retention else None)

    def release_session(self, session_id: str) -> bool:
        with self.lock:
            return self.kv.pool.release_session(session_id)

    def submit_background(self, request: Request) -> bool:
        """Queue a background prefill of a parked session (its queued older one dropped:
        the new prefix covers it); False when retention is off or it is not parked."""
        sid = request.session_id
        with self.lock:
            if (self._closed or not self.session_retention
                    or sid not in self.kv.pool.retention.sessions):
                return False
            old = self._background.pop(sid, None)
            if old is not None and old.status is RequestStatus.WAITING:
                self.scheduler.abort_request(old.request_id)
            self._background = {k: r for k, r in self._background.items() if not r.is_finished}
            self._background[sid] = request
            self.scheduler.add_request(request)
            self._ensure_loop_locked()
            self._work.notify()
            return True

    def abort(self, request_id: str) -> None:
        """Abort a live request now (blocks freed, its caller gets RequestAbortedError)."""
        with self.lock:
            tracked = self._tracked.get(request_id)
            if tracked is not None:
                self._abort_locked(tracked)
                tracked.sink.put(RequestAbortedError(f"request {request_id!r} was aborted"))

    def abort_own(self, request: Request) -> None:
        """Abort a request its own caller gave up on (closed stream, cancelled task...).

        Safe from a finalizer: when the lock is taken (possibly by this very thread, which a
        garbage collection can interrupt anywhere), the abort is queued for the loop instead.
        """
        if not self.lock.acquire(blocking=False):
            self._pending_aborts.append(request)
            return
        try:
            tracked = self._tracked.get(request.request_id)
            if tracked is not None and tracked.request is request:
                self._abort_locked(tracked)
        finally:
            self.lock.release()

    def stats(self) -> EngineStats:
        """A consistent snapshot of the engine-wide counters."""
        with self.lock:
            pool, scheduler = self.kv.pool, self.scheduler
            return EngineStats(
                num_blocks_total=pool.num_blocks,
                num_blocks_used=pool.num_used_blocks,
                num_blocks_free=pool.num_free_blocks,
                num_blocks_cached=pool.num_cached_blocks,
                prefix_cache_queries=self.kv.num_queried_tokens,
                prefix_cache_hits=self.kv.num_hit_tokens,
                num_running=len(scheduler.running),
                num_waiting=len(scheduler.waiting),
                num_preemptions=scheduler.num_preemptions,
                num_steps=scheduler.num_steps,
                num_draft_tokens=scheduler.num_draft_tokens,
                num_accepted_tokens=scheduler.num_accepted_tokens,
                num_forced_tokens=scheduler.num_forced_tokens,
                **self.kv.session_stats(),
                scheduling=scheduler.policy,
                decode_step=self._decode_step(),
                weights=dict(getattr(self.runner, "weights", None) or {}),
            )

    def _decode_step(self) -> dict[str, Any]:
        """The runner's step compiler's description (``StepCompiler.describe``), or {}."""
        describe = getattr(getattr(self.runner, "compiler", None), "describe", None)
        return describe() if callable(describe) else {}

    def warmup(self) -> None:
        """Run the model runner's warm-up (compilation, first-call allocations)."""
        if self._closed:
            raise EngineClosedError(self.closed_message())
        with self._runner_lock:
            self.runner.warmup()

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; False (nothing done) while requests hold blocks."""
        with self.lock:
            return self.kv.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the loop, fail every live request with EngineClosedError, drop the runner."""
        with self.lock:
            if not self._closed:
                self._closed = True
                self._close_reason = "the engine was shut down"
                self._fail_all_locked(EngineClosedError(self.closed_message()))
            self._work.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        _LIVE_DRIVERS.discard(self)
        with self._runner_lock:
            self.runner = None

    # ----------------------------------------------------------------- abort / failure

    def _abort_locked(self, tracked: Tracked) -> None:
        self._tracked.pop(tracked.request.request_id, None)
        self.scheduler.abort_request(tracked.request.request_id)
        self._work.notify()

    def _drain_pending_aborts_locked(self) -> None:
        while self._pending_aborts:
            request = self._pending_aborts.popleft()
            tracked = self._tracked.get(request.request_id)
            if tracked is not None and tracked.request is request:
                self._abort_locked(tracked)

    def _fail_locked(self, tracked: Tracked, error: BaseException) -> None:
        rid = tracked.request.request_id
        self._tracked.pop(rid, None)
        if not tracked.request.is_finished:
            self.scheduler.finish_request(tracked.request, RequestStatus.FINISHED_ABORTED)
        tracked.sink.put(error)

    def _fail_all_locked(self, error: BaseException) -> None:
        for tracked in list(self._tracked.values()):
            own = type(error)(*error.args)  # one instance per caller: tracebacks differ
            own.__cause__ = error.__cause__
            self._fail_locked(tracked, own)

    # ----------------------------------------------------------------- the loop

    def _ensure_loop_locked(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="langchain-ascend-engine",
                                            daemon=True)
            self.thread.start()

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
        with self.lock:
            self._stepping = None
            self._closed = True
            self._close_reason = f"the engine loop died: {type(exc).__name__}: {exc}"
            error = EngineClosedError(self.closed_message())
            error.__cause__ = exc
            self._fail_all_locked(error)

    def _run_one_iteration(self) -> bool:
        """Loop thread: wait until there is work and nobody else drives, run one step.

        False when the loop should end: the engine closed, or (where callers drive) it ran out
        of work, so the thread and its OpenMP pool go away.
        """
        me = threading.current_thread()
        with self.lock:
            while True:
                if self._closed:
                    if self._stepping is me:
                        self._stepping = None
                    return False
                if self._stepping is None or self._stepping is me:
                    work = self._next_batch_locked()
                    if work is not None:
                        self._stepping = me
                        break
                    self._stepping = None
                    if self.callers_drive:
                        if self.thread is me:
                            self.thread = None
                        return False
                self._work.wait()
        self._run_batch(*work)
        return True

    def next_item(self, sink: ThreadSink) -> Item:
        """The next item for a thread blocked in ``LLMEngine.generate``; on the CPU the thread
        runs the steps itself while no other thread does (see the module docstring)."""
        while True:
            try:
                return sink.queue.get_nowait()
            except queue.Empty:
                pass
            if not self._drive_until_item(sink):
                return sink.queue.get()  # another thread drives (or nothing is left to run)

    def _drive_until_item(self, sink: ThreadSink) -> bool:
        """Run steps on this thread until ``sink`` has an item; whether it has one. False
        at once when another thread drives, which then serves this request too."""
        me = threading.current_thread()
        with self.lock:
            if not self.callers_drive or self._stepping is not None or self._closed:
                return False
            self._stepping = me
        try:
            while sink.queue.empty():
                with self.lock:
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
                    with self.lock:    # ran for the others, who are scheduled again
                        self.scheduler.discard_scheduled()
                    raise
        finally:
            with self.lock:
                self._stepping = None
                finished_ids = [] if self._closed else self.scheduler.take_finished_ids()
                if not self._closed and self.scheduler.has_unfinished_requests():
                    self._ensure_loop_locked()  # hand the other requests to the loop thread
                self._work.notify_all()
            self._release(finished_ids)
        return not sink.queue.empty()

    def _next_batch_locked(self) -> tuple[ScheduledBatch, bool] | None:
        """The next step to run and whether it is only a release of finished requests; None
        when there is nothing to do."""
        self._drain_pending_aborts_locked()
        if self.scheduler.has_unfinished_requests():
            return self.scheduler.schedule(), False
        finished_ids = self.scheduler.take_finished_ids()
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
                               len(self.scheduler.waiting))
                with self.lock:
                    self._work.wait(0.01)
            return
        try:
            with self._runner_lock:
                if self.runner is None:
                    return
                sampled = list(self.runner.execute(batch))
            if len(sampled) != len(batch.segments):
                raise RuntimeError(f"model runner returned {len(sampled)} results for "
                                   f"{len(batch.segments)} segments")
        except Exception as exc:  # noqa: BLE001 - fail this step's requests, keep serving
            logger.exception("engine step failed")
            with self.lock:
                self._fail_step_locked(batch.segments, exc)
            return
        with self.lock:
            self._fail_faulted_locked(batch.segments)  # before update: their rows are dropped
            outputs = self.scheduler.update(batch, sampled)
            self._deliver_locked(outputs)

    def _release(self, request_ids: list[str]) -> None:
        if request_ids:
            with self._runner_lock:
                if self.runner is not None:
                    self.runner.release(request_ids)

    def _fail_step_locked(self, segments: Sequence[Any], exc: Exception) -> None:
        scheduled = self.scheduler.discard_scheduled()
        for segment in segments:
            tracked = self._tracked.get(segment.request_id)
            if tracked is None or tracked.request is not scheduled.get(segment.request_id):
                continue  # aborted while the step ran (its id may already be reused)
            error = EngineStepError(f"the model step for request {segment.request_id!r} failed: "
                                    f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._fail_locked(tracked, error)

    def _fail_faulted_locked(self, segments: Sequence[Any]) -> None:
        """Fail the requests of ``segments`` whose own constraint failed in this step; the
        scheduler then skips their rows (they are no longer live)."""
        for segment in segments:
            tracked = self._tracked.get(segment.request_id)
            if tracked is None:
                continue
            fault = fault_of(tracked.request)
            if fault is not None:
                logger.warning("request %s failed in its own constraint (%s): %r",
                               segment.request_id, fault[0], fault[1])
                self._fail_locked(tracked, fault_error(tracked.request, fault))

    # ----------------------------------------------------------------- delivery

    def _deliver_locked(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            tracked = self._tracked.get(out.request.request_id)
            if tracked is None or tracked.request is not out.request:
                continue
            fault = fault_of(out.request)
            if fault is not None:  # its is_terminated() failed while the step was applied
                self._fail_locked(tracked, fault_error(out.request, fault))
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
                    self.scheduler.finish_request(out.request, RequestStatus.FINISHED_ABORTED)

    def _deliver_one_locked(self, tracked: Tracked, out: StepOutput) -> bool:
        """Hand ``out``'s tokens to the request's sink; False when nobody is listening."""
        request = out.request
        new_ids = tracked.step_token_ids(out, self.scheduler)
        if not request.is_finished:
            if not tracked.stream:
                return True
            if tracked.sink.num_unread >= self._stream_buffer_limit:  # abandoned, see streams
                self._abort_locked(tracked)
                return tracked.sink.put(RequestAbortedError(
                    f"request {request.request_id!r} was aborted: its stream left "
                    f"{self._stream_buffer_limit} deltas unread (stream_buffer_limit), so "
                    "it counted as abandoned and its KV blocks were freed"))
            return tracked.sink.put(TokenDelta(request.request_id, new_ids,
                                               tracked.detokenizer.take_delta()))
        self._tracked.pop(request.request_id, None)
        return tracked.sink.put(tracked.final_delta(new_ids))
