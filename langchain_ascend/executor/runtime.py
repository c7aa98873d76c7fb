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
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_ascend.errors import ToolTimeoutError, ToolWorkersExhaustedError
from langchain_ascend.executor.workers import PoolFull, WorkerPool, _Job

_clock = time.perf_counter
#: How often a call waiting for a busy pool slot looks again.
_POOL_POLL_S = 0.005

# --------------------------------------------------------------------------- retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before running a failed call again.

    Attributes:
        times: Retries after the first attempt (0 = never retry).
        retry_on: Exception types, or a predicate, that make a tool error worth retrying.
        on_timeout: Retry attempts that ran past the timeout too.
        never: Exception types never retried (malformed calls).
        backoff_s: Delay before the first retry; doubles each time, with jitter in
            [50 %, 100 %], capped at ``max_backoff_s``.
        max_backoff_s: Longest delay between attempts.
    """

    times: int
    retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool]
    on_timeout: bool
    never: tuple[type[BaseException], ...]
    backoff_s: float
    max_backoff_s: float = 5.0

    def should_retry(self, exc: BaseException, attempts: int) -> bool:
        """True when a call that failed with ``exc`` after ``attempts`` attempts runs again."""
        if attempts > self.times or isinstance(exc, self.never):
            return False
        if isinstance(exc, ToolTimeoutError):
            return self.on_timeout
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return bool(self.retry_on(exc))

    def delay_s(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        base = min(self.backoff_s * (2 ** (attempts - 1)), self.max_backoff_s)
        return base * (0.5 + 0.5 * random.random())


# --------------------------------------------------------------------------- call records


@dataclass
class CallRecord:
    """Timing and outcome of one call across its attempts (times from ``perf_counter``;
    ``timed_out`` describes the last attempt)."""

    submitted: float
    first_start: float | None = None
    end: float | None = None
    attempts: int = 0
    attempt_ms: list[float] = field(default_factory=list)
    retry_wait_ms: float = 0.0
    timed_out: bool = False
    ok: bool = False
    value: Any = None
    error: BaseException | None = None

    def timing(self, origin: float) -> dict[str, Any]:
        """The ``tool_timing`` dict put in ``ToolMessage.response_metadata`` (milliseconds;
        ``start_ms``/``end_ms`` relative to ``origin``, when the executor started)."""
        start = self.first_start if self.first_start is not None else self.submitted
        end = self.end if self.end is not None else start
        return {
            "queue_ms": round((start - origin) * 1e3, 3),
            "run_ms": round(sum(self.attempt_ms), 3),
            "retry_wait_ms": round(self.retry_wait_ms, 3),
            "total_ms": round((end - origin) * 1e3, 3),
            "start_ms": round((start - origin) * 1e3, 3),
            "end_ms": round((end - origin) * 1e3, 3),
            "attempts": self.attempts,
            "retries": max(self.attempts - 1, 0),
            "attempt_ms": [round(ms, 3) for ms in self.attempt_ms],
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class CallSpec:
    """How to run one call.

    Attributes:
        name: Tool name, for messages.
        run_in_thread: The attempt body for a worker thread (sync tools; async-only tools in
            sync mode wrap ``asyncio.run``). None for native-async calls in async mode.
        run_async: Coroutine factory for native-async tools in async mode.
    """

    name: str
    run_in_thread: Callable[[], Any] | None
    run_async: Callable[[], Awaitable[Any]] | None = None


@dataclass(frozen=True)
class Limits:
    """Scheduling limits of one invocation.

    Attributes:
        concurrency: Most attempts running at once.
        timeout_s: Per-attempt deadline (None = none).
        retry: The retry policy.
        propagate: Predicate: this error leaves the executor (the rest is abandoned).
    """

    concurrency: int
    timeout_s: float | None
    retry: RetryPolicy
    propagate: Callable[[BaseException], bool]


def _timeout_error(name: str, timeout_s: float, attempts: int, total: int) -> ToolTimeoutError:
    return ToolTimeoutError(
        f"tool {name!r} timed out after {timeout_s * 1e3:.0f} ms (attempt {attempts} of "
        f"{total}); its result will be ignored")


# --------------------------------------------------------------------------- thread lanes


class _Lane:
    """One concurrency slot served by one worker thread."""

    __slots__ = ("job", "index", "start", "abandoned")

    def __init__(self) -> None:
        self.job: _Job | None = None
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
        self.origin = _clock()
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
            t0 = _clock()
            try:
                value, ok = contexts[index].run(body), True  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - classified by _settle_locked
                value, ok = exc, False
            t1 = _clock()
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
                    self._begin_locked(lane, index, _clock())

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
                self._fail_locked(index, _timeout_error(
                    self.specs[index].name, timeout_s, record.attempts, limits.retry.times + 1),
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
        wait: float | None = _POOL_POLL_S if full else None
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
            wait = run.service_locked(_clock())
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
                wait = run.service_locked(_clock())
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


# --------------------------------------------------------------------------- async tasks

_TIMED_OUT = object()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any, t0: float, t1: float) -> None:
    if not future.done():
        future.set_result((ok, value, t0, t1))


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _bind_sink(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
               ) -> Callable[[_Job, bool, Any, float, float], None]:
    def sink(job: _Job, ok: bool, value: Any, t0: float, t1: float) -> None:
        loop.call_soon_threadsafe(_settle, future, ok, value, t0, t1)

    return sink


async def run_async(specs: Sequence[CallSpec], limits: Limits, pool: WorkerPool
                    ) -> list[CallRecord]:
    """The async twin of :func:`run_sync`.

    Only sync bodies: thread lanes, driven from the event loop. With native-async tools:
    one task per call under an ``asyncio.Semaphore``; async tools run on the loop and are
    cancelled (not awaited) at their deadline, so one that ignores cancellation cannot make
    the caller late; sync bodies are awaited from the pool and abandoned at their deadline.
    """
    if all(spec.run_async is None for spec in specs):
        return await _run_lanes_async(specs, limits, pool)
    loop = asyncio.get_running_loop()
    origin = _clock()
    records = [CallRecord(submitted=origin) for _ in specs]
    gate = asyncio.Semaphore(limits.concurrency)
    timeout_s, retry = limits.timeout_s, limits.retry

    async def attempt(index: int) -> tuple[bool, Any, float, float]:
        spec = specs[index]
        if spec.run_async is not None:
            t0 = _clock()
            task = asyncio.ensure_future(spec.run_async())
            finished, _ = await asyncio.wait({task}, timeout=timeout_s)
            if not finished:
                task.cancel()
                task.add_done_callback(_swallow)
                return False, _TIMED_OUT, t0, _clock()
            t1 = _clock()
            exc = task.exception()
            return (True, task.result(), t0, t1) if exc is None else (False, exc, t0, t1)
        future: asyncio.Future[Any] = loop.create_future()
        while True:
            try:
                job = pool.submit(spec.run_in_thread,  # type: ignore[arg-type]
                                  contextvars.copy_context(), _bind_sink(loop, future), index)
                break
            except PoolFull:
                await asyncio.sleep(_POOL_POLL_S)
        finished, _ = await asyncio.wait([future], timeout=timeout_s)  # type: ignore[list-item]
        if not finished:
            pool.abandon(job)
            return False, _TIMED_OUT, _clock(), _clock()
        return future.result()

    async def run_one(index: int) -> None:
        record, spec = records[index], specs[index]
        while True:
            async with gate:
                now = _clock()
                record.attempts += 1
                record.timed_out = False  # describes the last attempt
                if record.first_start is None:
                    record.first_start = now
                try:
                    ok, value, t0, t1 = await attempt(index)
                except ToolWorkersExhaustedError as exc:
                    ok, value, t0, t1 = False, exc, now, now
                if ok:
                    record.attempt_ms.append((t1 - t0) * 1e3)
                    record.ok, record.value, record.end = True, value, t1
                    return
                if value is _TIMED_OUT:
                    record.timed_out = True
                    record.attempt_ms.append(timeout_s * 1e3)  # type: ignore[operator]
                    value = _timeout_error(spec.name, timeout_s,  # type: ignore[arg-type]
                                           record.attempts, retry.times + 1)
                else:
                    record.attempt_ms.append((t1 - t0) * 1e3)
            if limits.propagate(value):
                raise value
            if not retry.should_retry(value, record.attempts):
                record.error, record.end = value, _clock()
                return
            delay = retry.delay_s(record.attempts)
            record.retry_wait_ms += delay * 1e3
            await asyncio.sleep(delay)

    tasks = [asyncio.ensure_future(run_one(i)) for i in range(len(specs))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    return records
