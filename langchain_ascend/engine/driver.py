"""The step loop: who runs *schedule -> model step -> update*, and how results go back.

One thread at a time (the *driver*) runs the steps and hands each request's tokens to its
sink. A background loop thread (started on demand) serves coroutines and streams. Where
:func:`langchain_ascend.platform.callers_drive_steps` says so (the CPU), a thread blocked in
:meth:`~langchain_ascend.engine.llm_engine.LLMEngine.generate` drives the steps itself while
nobody else does, and the loop thread ends when it runs out of work, so the steps run on the
caller's OpenMP pool instead of a second one (see ``docs/performance.md``).

Fault isolation: a request's own callbacks inside a step (its grammar constraint's
``mask_logits`` / ``accept_token`` / ``is_terminated``) run behind a :class:`GuardedConstraint`
that records an exception instead of letting it end the step. The step then completes for
everyone: the forward already wrote every row's K/V, and each row's token depends only on its
own logits, so the other rows keep exactly the tokens they would have had without the faulty
request. The faulty request alone is failed with :class:`RequestFaultError` before the step's
results are applied (its row's token is discarded, its blocks freed). A step that fails in a
way no request owns (the forward itself) fails all of that step's requests with
:class:`EngineStepError`, and the engine keeps serving.

Locking: ``_lock`` guards the scheduler, the block pool and the per-request state. A driver
holds it while scheduling and while applying a step's results, never while the model runs, so
``abort`` (and a closed stream or a cancelled task) frees a request's blocks at once.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

from langchain_ascend.engine.core.batch import ScheduledBatch
from langchain_ascend.engine.core.outputs import RequestOutput, TokenDelta
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.scheduler import Scheduler, StepOutput
from langchain_ascend.engine.streams import Item, ThreadSink, Tracked
from langchain_ascend.errors import (
    EngineClosedError,
    EngineStepError,
    RequestAbortedError,
    RequestFaultError,
)

logger = logging.getLogger(__name__)


class GuardedConstraint:
    """One request's :class:`~langchain_ascend.engine.core.sampling_params.TokenConstraint`,
    with its exceptions recorded in :attr:`fault` instead of raised into the step.

    Once faulted the wrapper stops calling the constraint: ``mask_logits`` leaves a neutral
    row (all zeros, so sampling that row cannot fail on an all ``-inf`` row; its token is
    discarded anyway), ``accept_token`` does nothing and ``is_terminated`` says True. Other
    attributes are the wrapped constraint's.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fault: tuple[str, Exception] | None = None

    def mask_logits(self, logits: Any) -> None:
        if self.fault is None:
            try:
                self.inner.mask_logits(logits)
                return
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("mask_logits", exc)
        logits.fill_(0.0)

    def accept_token(self, token_id: int) -> None:
        if self.fault is None:
            try:
                self.inner.accept_token(token_id)
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("accept_token", exc)

    def is_terminated(self) -> bool:
        if self.fault is None:
            try:
                return bool(self.inner.is_terminated())
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("is_terminated", exc)
        return True

    def jump_forward(self, limit: int) -> list[int]:
        """The wrapped constraint's forced tokens (none if it has no ``jump_forward``)."""
        jump = getattr(self.inner, "jump_forward", None)
        if self.fault is None and jump is not None:
            try:
                return [int(t) for t in jump(limit)]
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("jump_forward", exc)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def fault_of(request: Request) -> tuple[str, Exception] | None:
    """``(callback, exception)`` when the request's own constraint failed, else None."""
    constraint = request.sampling.constraint
    return constraint.fault if isinstance(constraint, GuardedConstraint) else None


def fault_error(request: Request, fault: tuple[str, Exception]) -> RequestFaultError:
    """The error a request whose own callback failed ends with (the cause chained)."""
    where, exc = fault
    error = RequestFaultError(
        f"request {request.request_id!r} failed in its own part of the model step: its "
        f"constraint's {where}() raised {type(exc).__name__}: {exc}; the other requests "
        "of the step were not affected")
    error.__cause__ = exc
    return error


class EngineDriver:
    """The loop, driving and delivery half of :class:`~langchain_ascend.engine.llm_engine.LLMEngine`
    (a base class: the engine sets these attributes up in its ``_setup``)."""

    _lock: threading.Lock
    _work: threading.Condition
    _runner_lock: threading.Lock
    _runner: Any
    _scheduler: Scheduler
    _tracked: dict[str, Tracked]
    _thread: threading.Thread | None
    _driver: threading.Thread | None  # the thread running steps now, if any
    _callers_drive: bool
    _closed: bool
    _close_reason: str
    _pending_aborts: collections.deque[Request]
    _stream_buffer_limit: int

    # ----------------------------------------------------------------- abort / failure

    def _abort_locked(self, tracked: Tracked) -> None:
        self._tracked.pop(tracked.request.request_id, None)
        self._scheduler.abort_request(tracked.request.request_id)
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

    def _next_item(self, sink: ThreadSink) -> Item:
        """The next item for a thread blocked in :meth:`generate`; on the CPU the thread runs
        the steps itself while no other thread does (see the module docstring)."""
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
            self._fail_faulted_locked(batch.segments)  # before update: their rows are dropped
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
                    self._scheduler.finish_request(out.request, RequestStatus.FINISHED_ABORTED)

    def _deliver_one_locked(self, tracked: Tracked, out: StepOutput) -> bool:
        request = out.request
        new_ids = list(out.new_token_ids)
        if out.finished and request.last_token_hidden:
            new_ids.pop()
        detok = tracked.detokenizer
        for index, token_id in enumerate(new_ids):
            detok.add_token(token_id)
            if detok.stop_string is not None:
                # Several tokens came in one step (accepted drafts): keep none past the one
                # that completed the stop string, as one-token steps would have.
                surplus = len(out.new_token_ids) - (index + 1)
                if surplus:
                    del new_ids[index + 1:]
                    if not request.is_finished:
                        self._scheduler.finish_request(
                            request, RequestStatus.FINISHED_STOPPED,
                            stop_reason=detok.stop_string)
                    request.last_token_hidden = False
                    request.truncate_output(request.num_output_tokens - surplus)
                break
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
            if tracked.sink.num_unread >= self._stream_buffer_limit:  # abandoned, see streams
                self._abort_locked(tracked)
                return tracked.sink.put(RequestAbortedError(
                    f"request {request.request_id!r} was aborted: its stream left "
                    f"{self._stream_buffer_limit} deltas unread (stream_buffer_limit), so "
                    "it counted as abandoned and its KV blocks were freed"))
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
