"""What one tool call is to the scheduler: how to run it (:class:`CallSpec`), the bounds of an
invocation (:class:`Limits`, :class:`RetryPolicy`) and what happened (:class:`CallRecord`).
Shared by the thread lanes (:mod:`.runtime`) and the async tasks (:mod:`.async_tasks`)."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import ToolTimeoutError

if TYPE_CHECKING:
    from langchain_ascend.executor.calls import InputKind, PreparedCall
    from langchain_ascend.executor.workers import CallerStreams

clock = time.perf_counter
#: How often a call waiting for a busy pool slot looks again.
POOL_POLL_S = 0.005

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


def timeout_error(name: str, timeout_s: float, attempts: int, retry: RetryPolicy
                  ) -> ToolTimeoutError:
    """The error of a call's attempt that ran past ``timeout_s``; the count of attempts is
    named only where a timeout is retried (``retry.on_timeout``)."""
    which = (f"attempt {attempts} of {retry.times + 1}" if retry.on_timeout
             else "timeouts are not retried: retry_on_timeout=False")
    return ToolTimeoutError(
        f"tool {name!r} timed out after {timeout_s * 1e3:.0f} ms ({which}); its result will "
        "be ignored")


@dataclass
class Plan:
    """One invocation, checked: every call in input order, the ones that run, how to run each
    and the bounds they run under."""

    kind: InputKind
    prepared: list[PreparedCall]
    runnable: list[PreparedCall]
    specs: list[CallSpec]
    limits: Limits
    streams: CallerStreams | None
    use_async: bool
