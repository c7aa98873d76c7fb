"""When :class:`~langchain_ascend.tools.NPUStreamToolExecutor` runs each call: the concurrency
bound, per-attempt deadlines, retries with backoff and per-call timing. No LangChain messages
here; threads and streams are :mod:`langchain_ascend.executor.workers`.

Sync bodies run on *lanes* (worker threads that take the next call from one shared queue, due
retries first) while the driver sleeps until the nearest deadline; a late lane is abandoned
and replaced, since a thread cannot be killed. Native-async tools run as loop tasks under one
semaphore; an invocation that mixes both sends every call that way, so one bound covers all.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from langchain_ascend.errors import ToolWorkersExhaustedError
from langchain_ascend.executor.async_tasks import TaskRun
from langchain_ascend.executor.call_types import (
    POOL_POLL_S,
    CallRecord,
    CallSpec,
    Limits,
    RetryPolicy,
    clock,
    timeout_error,
)
from langchain_ascend.executor.workers import Job, PoolFull, WorkerPool

__all__ = ["CallRecord", "CallSpec", "Limits", "RetryPolicy", "run_async", "run_sync"]

# --------------------------------------------------------------------------- thread lanes


class _Lane:
    """One concurrency slot served by one worker thread."""

    __slots__ = ("job", "index", "start", "abandoned")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.index: int | None = None
        self.start = 0.0
        self.abandoned = False


class _LaneRun:
    """Shared state of one invocation whose calls all run on worker threads.

    Every field is guarded by ``lock``. ``wake`` tells the driver to look again; it is only
    called for events the driver must act on (all done, a propagating error, a lane leaving).
    """

    def __init__(self, specs: Sequence[CallSpec], limits: Limits, pool: WorkerPool) -> None:
        self.specs = specs
        self.limits = limits
        self.pool = pool
        self.lock = threading.Lock()
        self.wake: Callable[[], None] = lambda: None
        self.origin = clock()
        self.records = [CallRecord(submitted=self.origin) for _ in specs]
        # One context per call, copied in the caller's context; a retry after a timeout gets a
        # fresh copy because the abandoned attempt may still be running inside the old one.
        self.contexts = [contextvars.copy_context() for _ in specs]
        self.waiting: deque[int] = deque(range(len(specs)))
        self.retry_at: list[tuple[float, int]] = []
        self.lanes: list[_Lane] = []
        self.remaining = len(specs)
        self.fatal: BaseException | None = None

    # -- lane side (worker threads)

    def lane_main(self, lane: _Lane) -> None:
        """Run calls until none is left; the driver already gave this lane its first one."""
        index = lane.index
        specs, contexts = self.specs, self.contexts
        while index is not None:
            body = specs[index].run_in_thread
            t0 = clock()
            try:
                value, ok = contexts[index].run(body), True  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - classified by _settle_locked
                value, ok = exc, False
            t1 = clock()
            with self.lock:
                if lane.abandoned:
                    return
                lane.index = None
                self.records[index].attempt_ms.append((t1 - t0) * 1e3)
                self._settle_locked(index, ok, value, t1)
                index = self._take_locked(t1) if self.fatal is None else None
                if index is None:
                    self.lanes.remove(lane)
                    if self.remaining:
                        self.wake()
                else:
                    self._begin_locked(lane, index, clock())

    def _take_locked(self, now: float) -> int | None:
        """The next call to start: a retry that is due, else a new call, else None."""
        if self.retry_at and self.retry_at[0][0] <= now:
            return heapq.heappop(self.retry_at)[1]
        if self.waiting:
            return self.waiting.popleft()
        return None

    def _begin_locked(self, lane: _Lane, index: int, now: float) -> None:
        record = self.records[index]
        record.attempts += 1
        record.timed_out = False  # describes the last attempt
        if record.first_start is None:
            record.first_start = now
        lane.index, lane.start = index, now

    def _settle_locked(self, index: int, ok: bool, value: Any, now: float) -> None:
        record = self.records[index]
        if ok:
            record.ok, record.value, record.end = True, value, now
            self._done_locked()
            return
        self._fail_locked(index, value, now)

    def _fail_locked(self, index: int, exc: BaseException, now: float) -> None:
        record = self.records[index]
        if self.limits.propagate(exc):
            if self.fatal is None:
                self.fatal = exc
            self.wake()
            return
        if self.limits.retry.should_retry(exc, record.attempts):
            delay = self.limits.retry.delay_s(record.attempts)
            record.retry_wait_ms += delay * 1e3
            heapq.heappush(self.retry_at, (now + delay, index))
            return
        record.error, record.end = exc, now
        self._done_locked()

    def _done_locked(self) -> None:
        self.remaining -= 1
        if not self.remaining:
            self.wake()

    # -- driver side (caller thread or event loop)

    def service_locked(self, now: float) -> float | None:
        """Expire deadlines, start lanes; return seconds until the next check (None: until
        woken). Raises the propagating error, abandoning calls still in flight."""
        limits, timeout_s = self.limits, self.limits.timeout_s
        if self.fatal is not None:
            self._abandon_all_locked()
            raise self.fatal
        if timeout_s is not None:
            for lane in [ln for ln in self.lanes if ln.index is not None]:
                if lane.start + timeout_s > now:
                    continue
                index = lane.index
                assert index is not None and lane.job is not None
                lane.abandoned = True
                self.lanes.remove(lane)
                self.pool.abandon(lane.job)
                record = self.records[index]
                record.timed_out = True
                record.attempt_ms.append(timeout_s * 1e3)
                self.contexts[index] = contextvars.copy_context()
                self._fail_locked(index, timeout_error(
                    self.specs[index].name, timeout_s, record.attempts, limits.retry),
                    now)
            if self.fatal is not None:
                self._abandon_all_locked()
                raise self.fatal
        # A new lane gets its first call here, so every attempt in flight is known below
        # (later attempts of a lane start after this one and so have later deadlines).
        full = False
        while self.remaining and len(self.lanes) < limits.concurrency:
            index = self._take_locked(now)
            if index is None:
                break
            lane = _Lane()
            self._begin_locked(lane, index, now)
            try:
                lane.job = self.pool.submit(functools.partial(self.lane_main, lane),
                                            contextvars.Context())
            except ToolWorkersExhaustedError as exc:
                self._refuse_locked(index, exc, now)
                continue
            except PoolFull:  # the slots free when attempts (maybe other runs') return
                self._unbegin_locked(index)
                full = True
                break
            self.lanes.append(lane)
        if not self.remaining:
            return 0.0
        wait: float | None = POOL_POLL_S if full else None
        if timeout_s is not None:
            starts = [ln.start for ln in self.lanes if ln.index is not None]
            if starts:
                wait = min(starts) + timeout_s - now
        if self.retry_at and len(self.lanes) < limits.concurrency:
            due = self.retry_at[0][0] - now
            wait = due if wait is None else min(wait, due)
        return None if wait is None else max(wait, 0.0)

    def _unbegin_locked(self, index: int) -> None:
        """Undo :meth:`_begin_locked` for a call that found no free slot: it waits again."""
        record = self.records[index]
        record.attempts -= 1
        if not record.attempts:
            record.first_start = None
        self.waiting.appendleft(index)

    def _refuse_locked(self, index: int, exc: ToolWorkersExhaustedError, now: float) -> None:
        """No thread for a lane: fail its call with ``exc`` so the run still progresses."""
        record = self.records[index]
        record.attempt_ms.append(0.0)
        record.error, record.end = exc, now
        if self.limits.propagate(exc):
            self.fatal = exc
            self._abandon_all_locked()
            raise exc
        self._done_locked()

    def _abandon_all_locked(self) -> None:
        for lane in self.lanes:
            if lane.index is not None and lane.job is not None:
                lane.abandoned = True
                self.pool.abandon(lane.job)
        self.lanes.clear()


def run_sync(specs: Sequence[CallSpec], limits: Limits, pool: WorkerPool) -> list[CallRecord]:
    """Run every call on thread lanes from the calling thread; one record per call, in order.

    Raises:
        BaseException: The first error ``limits.propagate`` says must leave; calls still in
            flight are abandoned, calls not started never run.
    """
    run = _LaneRun(specs, limits, pool)
    changed = threading.Condition(run.lock)
    run.wake = changed.notify_all
    with run.lock:
        while True:
            wait = run.service_locked(clock())
            if not run.remaining:
                return run.records
            try:
                changed.wait(wait)
            except BaseException as exc:  # e.g. KeyboardInterrupt: stop starting new calls
                run.fatal = run.fatal or exc
                run._abandon_all_locked()
                raise


async def _run_lanes_async(specs: Sequence[CallSpec], limits: Limits,
                           pool: WorkerPool) -> list[CallRecord]:
    loop = asyncio.get_running_loop()
    run = _LaneRun(specs, limits, pool)
    # A fresh future per round, made before the state is read: a wake after that resolves
    # it, a wake before it is already reflected in what the round reads.
    current: list[asyncio.Future[None]] = [loop.create_future()]

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(_resolve, current[0])
        except RuntimeError:
            pass  # loop closed: nobody is waiting any more

    run.wake = wake
    try:
        while True:
            current[0] = changed = loop.create_future()
            with run.lock:
                wait = run.service_locked(clock())
                if not run.remaining:
                    return run.records
            timer = None if wait is None else loop.call_later(wait, _resolve, changed)
            try:
                await changed
            finally:
                if timer is not None:
                    timer.cancel()
    except BaseException:
        with run.lock:
            run.fatal = run.fatal or asyncio.CancelledError()
            run._abandon_all_locked()
        raise


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def run_async(specs: Sequence[CallSpec], limits: Limits, pool: WorkerPool
                    ) -> list[CallRecord]:
    """The async twin of :func:`run_sync`: only sync bodies run on thread lanes driven from
    the event loop; with native-async tools every call is a loop task
    (:class:`~langchain_ascend.executor.async_tasks.TaskRun`), so one bound covers all."""
    if all(spec.run_async is None for spec in specs):
        return await _run_lanes_async(specs, limits, pool)
    return await TaskRun(specs, limits, pool).run()
