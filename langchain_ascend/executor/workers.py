"""Where :class:`~langchain_ascend.tools.NPUStreamToolExecutor` runs sync tool bodies: daemon
worker threads that tolerate hung calls, and device side streams.

The :class:`WorkerPool` grows to the calls in flight (tools mostly wait on I/O) and retires
idle threads. A thread past its deadline is abandoned, not killed. The bound on stuck threads
holds strictly: any running attempt may hang, so at most ``max_abandoned`` attempts are busy
at once (running or stuck); a further attempt waits for a slot (:class:`PoolFull`) while some
slot is held by a live attempt, and fails fast (``ToolWorkersExhaustedError``) once every slot
is held by a stuck one. Daemon threads never block interpreter exit.
On an accelerator each attempt runs on a pooled side stream ordered after the caller's work;
the caller's stream waits on its "done" event and result tensors are ``record_stream``-ed, so
no global synchronize is needed. On CPU none of this runs; the NPU path (torch_npu's
torch.cuda-style stream API) is untested on hardware.
"""

from __future__ import annotations

import contextvars
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_ascend import platform
from langchain_ascend.errors import ToolWorkersExhaustedError

_clock = time.perf_counter

# --------------------------------------------------------------------------- worker threads


class PoolFull(Exception):  # noqa: N818 - a signal to wait, not an error for users
    """Every slot is busy, some with a live attempt: try again when one returns."""


class Job:
    """One attempt handed to a worker thread."""

    __slots__ = ("fn", "context", "sink", "index", "finished", "abandoned")

    def __init__(self, fn: Callable[[], Any], context: contextvars.Context,
                 sink: Callable[[Job, bool, Any, float, float], None] | None,
                 index: int) -> None:
        self.fn = fn
        self.context = context
        self.sink = sink
        self.index = index
        self.finished = False
        self.abandoned = False


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a :class:`WorkerPool` (for tests and diagnostics).

    Attributes:
        threads: Live worker threads, abandoned ones included.
        idle: Threads waiting for work.
        abandoned: Threads still running an attempt whose caller gave up on it.
    """

    threads: int
    idle: int
    abandoned: int


class WorkerPool:
    """Daemon worker threads that grow with demand and tolerate hung attempts.

    Args:
        max_abandoned: Most threads that may be stuck in timed-out attempts at once.
        idle_s: An idle thread exits after this many seconds without work.
    """

    _names = itertools.count()

    def __init__(self, max_abandoned: int = 32, idle_s: float = 30.0) -> None:
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._abandoned = 0
        self._max_abandoned = max_abandoned
        self._idle_s = idle_s

    def stats(self) -> PoolStats:
        """Current thread counts."""
        with self._lock:
            return PoolStats(self._threads, self._idle, self._abandoned)

    def submit(self, fn: Callable[[], Any], context: contextvars.Context,
               sink: Callable[[Job, bool, Any, float, float], None] | None = None,
               index: int = -1) -> Job:
        """Run ``fn`` inside ``context`` on a worker; ``sink(job, ok, value, t0, t1)``, if
        given, gets the outcome (``value`` is the exception when not ``ok``).

        Raises:
            ToolWorkersExhaustedError: ``max_abandoned`` threads are stuck.
            PoolFull: ``max_abandoned`` attempts are busy, not all stuck: wait and retry.
        """
        job = Job(fn, context, sink, index)
        with self._lock:
            busy = self._threads - self._idle  # running or stuck attempts
            if self._abandoned >= self._max_abandoned:
                raise ToolWorkersExhaustedError(
                    f"{self._abandoned} tool threads are still stuck in calls that timed out "
                    f"(limit max_abandoned_threads={self._max_abandoned}); no new sync tool "
                    "call is started until some of them return (async tools still run)")
            if busy >= self._max_abandoned:
                raise PoolFull
            if self._idle:
                self._idle -= 1
                spawn = False
            else:
                self._threads += 1
                spawn = True
        self._jobs.put(job)
        if spawn:
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"lca-tool-{next(self._names)}")
            try:
                thread.start()
            except RuntimeError as exc:
                with self._lock:
                    self._threads -= 1
                raise ToolWorkersExhaustedError(f"cannot start a tool thread: {exc}") from exc
        return job

    def abandon(self, job: Job) -> None:
        """Give up on ``job``: its thread keeps running, counted as stuck until it returns."""
        with self._lock:
            if not job.finished and not job.abandoned:
                job.abandoned = True
                self._abandoned += 1

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            try:
                job = jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    # Idle threads not reserved by a submit may leave; when every idle thread
                    # is reserved (idle == 0) a job is on its way and this one must stay.
                    if self._idle:
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            t0 = _clock()
            try:
                value, ok = job.context.run(job.fn), True
            except BaseException as exc:  # noqa: BLE001 - the caller decides what it means
                value, ok = exc, False
            t1 = _clock()
            with self._lock:
                job.finished = True
                if job.abandoned:
                    self._abandoned -= 1
                self._idle += 1
            if job.sink is None:
                continue
            try:
                job.sink(job, ok, value, t0, t1)
            except RuntimeError:
                pass  # the caller's event loop is gone: nobody is waiting for this result


# --------------------------------------------------------------------------- device streams


class StreamPool:
    """Side streams of one device, reused across calls.

    Each concurrent holder gets a stream of its own while fewer than ``max_streams`` are
    busy; beyond that streams are shared round-robin (still correct, only serialised).
    """

    def __init__(self, device: Any, max_streams: int = 16) -> None:
        self.device = device
        self._free: list[Any] = []
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._max = max_streams
        self._next_shared = 0

    def acquire(self) -> Any:
        """A stream for one attempt; give it back with :meth:`release`."""
        with self._lock:
            if self._free:
                return self._free.pop()
            if len(self._all) < self._max:
                stream = platform.new_stream(self.device)
                self._all.append(stream)
                return stream
            self._next_shared = (self._next_shared + 1) % len(self._all)
            return self._all[self._next_shared]

    def release(self, stream: Any) -> None:
        """Return a stream taken with :meth:`acquire`."""
        with self._lock:
            if stream not in self._free:
                self._free.append(stream)


_stream_pools: dict[str, StreamPool] = {}
_stream_pools_lock = threading.Lock()


def stream_pool(device: Any) -> StreamPool:
    """The process-wide stream pool of ``device``."""
    key = str(device)
    with _stream_pools_lock:
        pool = _stream_pools.get(key)
        if pool is None:
            pool = _stream_pools[key] = StreamPool(device)
        return pool


@dataclass
class StreamResult:
    """What a stream-wrapped attempt returns: the output and the event marking its end."""

    value: Any
    done: Any
    stream: str


class CallerStreams:
    """Stream bookkeeping of one executor invocation on an accelerator.

    Created in the caller's thread: remembers the caller's current stream and records a
    "ready" event on it. :meth:`run` (worker thread) runs one attempt on a pooled side stream;
    :meth:`join` (caller's thread) makes the caller's stream wait for it.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.pool = stream_pool(device)
        self.caller = platform.current_stream(device)
        self.ready = platform.new_event(device)
        self.ready.record(self.caller)

    def run(self, fn: Callable[[], Any]) -> StreamResult:
        """Run ``fn`` with a side stream current, ordered after the caller's earlier work."""
        stream = self.pool.acquire()
        try:
            stream.wait_event(self.ready)
            with platform.use_stream(stream):
                value = fn()
            done = platform.new_event(self.device)
            done.record(stream)
        finally:
            self.pool.release(stream)
        return StreamResult(value, done, repr(stream))

    def join(self, result: StreamResult, tensors: Sequence[Any]) -> None:
        """Order the caller's stream after the attempt; keep result tensors alive for it."""
        self.caller.wait_event(result.done)
        for tensor in tensors:
            tensor.record_stream(self.caller)


def device_tensors(value: Any, device: Any, depth: int = 5) -> list[Any]:
    """Tensors on ``device`` inside ``value`` (nested lists/tuples/dicts, an ``artifact``)."""
    import torch

    found: list[Any] = []

    def walk(item: Any, level: int) -> None:
        if torch.is_tensor(item):
            if item.device == device:
                found.append(item)
        elif level < depth:
            if isinstance(item, dict):
                for sub in item.values():
                    walk(sub, level + 1)
            elif isinstance(item, (list, tuple)):
                for sub in item:
                    walk(sub, level + 1)
            elif hasattr(item, "artifact"):
                walk(item.artifact, level + 1)

    walk(value, 0)
    return found
