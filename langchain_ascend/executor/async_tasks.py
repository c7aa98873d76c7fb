"""Calls as event-loop tasks, for an async invocation with native-async tools.

One task per call under an ``asyncio.Semaphore``: async tools run on the loop and are
cancelled (not awaited) at their deadline, so one that ignores cancellation cannot make the
caller late; sync bodies are awaited from the worker pool and abandoned at their deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from typing import Any

from langchain_ascend.errors import ToolWorkersExhaustedError
from langchain_ascend.executor.call_types import (
    POOL_POLL_S,
    CallRecord,
    CallSpec,
    Limits,
    clock,
    timeout_error,
)
from langchain_ascend.executor.workers import Job, PoolFull, WorkerPool

_TIMED_OUT = object()
Outcome = tuple[bool, Any, float, float]  # ok, value or error, attempt start, attempt end


def _settle(future: asyncio.Future[Any], ok: bool, value: Any, t0: float, t1: float) -> None:
    if not future.done():
        future.set_result((ok, value, t0, t1))


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _bind_sink(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
               ) -> Callable[[Job, bool, Any, float, float], None]:
    def sink(job: Job, ok: bool, value: Any, t0: float, t1: float) -> None:
        loop.call_soon_threadsafe(_settle, future, ok, value, t0, t1)

    return sink


class TaskRun:
    """One async invocation: a record per call, one task per call, one semaphore."""

    def __init__(self, specs: Sequence[CallSpec], limits: Limits, pool: WorkerPool) -> None:
        self.specs, self.limits, self.pool = specs, limits, pool
        self.loop = asyncio.get_running_loop()
        origin = clock()
        self.records = [CallRecord(submitted=origin) for _ in specs]
        self.gate = asyncio.Semaphore(limits.concurrency)

    async def run(self) -> list[CallRecord]:
        """Run every call; one record per call, in order (the first error that must leave
        cancels the other tasks)."""
        tasks = [asyncio.ensure_future(self.run_one(i)) for i in range(len(self.specs))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        return self.records

    async def attempt(self, index: int) -> Outcome:
        """One attempt of call ``index``, cut at the deadline."""
        spec, timeout_s = self.specs[index], self.limits.timeout_s
        if spec.run_async is not None:
            t0 = clock()
            task = asyncio.ensure_future(spec.run_async())
            finished, _ = await asyncio.wait({task}, timeout=timeout_s)
            if not finished:
                task.cancel()
                task.add_done_callback(_swallow)
                return False, _TIMED_OUT, t0, clock()
            t1 = clock()
            exc = task.exception()
            return (True, task.result(), t0, t1) if exc is None else (False, exc, t0, t1)
        future: asyncio.Future[Any] = self.loop.create_future()
        while True:
            try:
                job = self.pool.submit(spec.run_in_thread,  # type: ignore[arg-type]
                                       contextvars.copy_context(),
                                       _bind_sink(self.loop, future), index)
                break
            except PoolFull:
                await asyncio.sleep(POOL_POLL_S)
        finished, _ = await asyncio.wait([future], timeout=timeout_s)  # type: ignore[list-item]
        if not finished:
            self.pool.abandon(job)
            return False, _TIMED_OUT, clock(), clock()
        return future.result()

    async def run_one(self, index: int) -> None:
        """Attempts of call ``index`` until one succeeds, the error leaves, or retries end."""
        record, retry = self.records[index], self.limits.retry
        while True:
            async with self.gate:
                ok, value = await self._timed_attempt(index, record)
                if ok:
                    return
            if self.limits.propagate(value):
                raise value
            if not retry.should_retry(value, record.attempts):
                record.error, record.end = value, clock()
                return
            delay = retry.delay_s(record.attempts)
            record.retry_wait_ms += delay * 1e3
            await asyncio.sleep(delay)

    async def _timed_attempt(self, index: int, record: CallRecord) -> tuple[bool, Any]:
        """Run one attempt and write its timing: ``(True, None)`` on success, else
        ``(False, error)``."""
        now = clock()
        record.attempts += 1
        record.timed_out = False  # describes the last attempt
        if record.first_start is None:
            record.first_start = now
        try:
            ok, value, t0, t1 = await self.attempt(index)
        except ToolWorkersExhaustedError as exc:
            ok, value, t0, t1 = False, exc, now, now
        if ok:
            record.attempt_ms.append((t1 - t0) * 1e3)
            record.ok, record.value, record.end = True, value, t1
            return True, None
        timeout_s = self.limits.timeout_s
        if value is _TIMED_OUT:
            record.timed_out = True
            record.attempt_ms.append(timeout_s * 1e3)  # type: ignore[operator]
            return False, timeout_error(self.specs[index].name,
                                        timeout_s,  # type: ignore[arg-type]
                                        record.attempts, self.limits.retry)
        record.attempt_ms.append((t1 - t0) * 1e3)
        return False, value
