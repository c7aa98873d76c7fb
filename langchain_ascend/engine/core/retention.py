"""Sessions kept resident while their tools run: soft, capped, always reclaimable.

Pure Python, no torch. An agent's hop that ends in tool calls *parks* its session: the
blocks holding the session's prefix stay in the pool past the request's end, with a
time-to-live (TTL) estimated from how long the tools it called took before
(:class:`ToolLatencyEstimator`). When the next hop comes back, its prompt hits those blocks
through the ordinary prefix cache (:class:`~.block_pool.BlockPool` verifies every hit).

Policy, stated up front:

* **Soft.** A retained block is a *free* block (reference count 0) on its own free list,
  allocated only after the uncached blocks and the plain LRU cached blocks are used up. So
  retention never blocks an admission and cannot deadlock the pool: every retained block is
  reclaimable at once, by construction (SGLang's #21884 reverted a hard pin that wedged the
  pool). Blocks a live request holds are not counted as retained.
* **Capped.** Retained free blocks never exceed ``cap_fraction`` of the pool; parking or
  freeing past the cap gives up sessions until it holds.
* **Given up by expected benefit.** Under pressure (or past the cap) the session with the
  lowest ``tokens it would recompute x chance it returns within its TTL`` is released first
  (ties: the earliest deadline). Released blocks join the *front* of the LRU list, tail block
  first, so what allocation takes next is that session's tail and its prefix may still hit.
* **A session that never returns frees at its TTL** (:meth:`RetentionTable.expired`, run
  before every scheduling step). One whose next request has arrived but still waits for
  admission has returned in time: it no longer expires (``RetainedSession.returned``).

Chance of return: before its expected return time (``parked_at + expected``) a session counts
as certain to return (1.0); from there its chance falls linearly to 0 at its deadline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from langchain_ascend.errors import InvalidRequestError

DEFAULT_TOOL_LATENCY_S = 1.0
"""Expected tool latency before a tool's first measurement."""
TTL_FACTOR = 2.0
"""TTL = ``TTL_FACTOR x`` the expected latency of the slowest tool called ``+ TTL_SLACK_S``."""
TTL_SLACK_S = 0.5
MAX_TTL_S = 600.0
"""No estimate parks a session longer than this (an explicit TTL may be up to a day)."""
MAX_EXPLICIT_TTL_S = 86400.0
EWMA_WEIGHT = 0.3
"""Weight of a new measurement in a tool's running latency estimate."""
DEFAULT_CAP_FRACTION = 0.5


class ToolLatencyEstimator:
    """A per-tool-name running estimate (exponentially weighted mean) of tool latency.

    Args:
        default_s: The estimate of a tool never measured.
        weight: Weight of each new measurement.
    """

    def __init__(self, default_s: float = DEFAULT_TOOL_LATENCY_S,
                 weight: float = EWMA_WEIGHT) -> None:
        self.default_s = default_s
        self.weight = weight
        self._mean: dict[str, float] = {}
        self.num_measurements = 0

    def record(self, name: str, seconds: float) -> None:
        """Add one measured latency of tool ``name``."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        old = self._mean.get(name)
        self._mean[name] = seconds if old is None else old + self.weight * (seconds - old)
        self.num_measurements += 1

    def estimate(self, name: str) -> float:
        return self._mean.get(name, self.default_s)

    def expected_wait(self, names: Iterable[str]) -> float:
        """Expected time until a hop calling ``names`` (in parallel) has all its results:
        the slowest tool's estimate (the default when no name is given)."""
        return max((self.estimate(n) for n in names), default=self.default_s)

    def snapshot(self) -> dict[str, float]:
        return dict(self._mean)


def ttl_for(expected_s: float) -> float:
    """The TTL a session waiting ``expected_s`` for its tools gets."""
    return min(MAX_TTL_S, TTL_FACTOR * expected_s + TTL_SLACK_S)


def parse_retention(value: object) -> float | None:
    """A retention setting as seconds: None / ``"in_memory"`` -> None (estimate from the
    tools), a number of seconds, or a duration ``"300s"``, ``"5m"``, ``"1h"``, ``"24h"``.

    Raises:
        InvalidRequestError: Anything else, or a duration outside (0, 1 day].
    """
    if value is None or value == "in_memory":
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
        text = value.strip().lower()
        try:
            if text and text[-1] in units:
                seconds = float(text[:-1]) * units[text[-1]]
            else:
                seconds = float(text)
        except ValueError:
            seconds = None
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_EXPLICIT_TTL_S:
        raise InvalidRequestError(
            f"prompt cache retention must be 'in_memory' or a duration like '300s', '5m', "
            f"'24h' (at most 1 day); got {value!r}")
    return seconds


@dataclass
class RetainedSession:
    """One parked session.

    Attributes:
        session_id: The agent's session.
        block_ids: The blocks of its prefix, in table order (shared ones included).
        parked_at: Clock reading when it parked.
        expected_s: When its tools are expected to be done, seconds after ``parked_at``.
        deadline: Clock reading at which it is released if it has not come back.
        returned: Its next request has arrived and waits to be admitted: it no longer
            expires, and it counts as certain to return.
    """

    session_id: str
    block_ids: list[int] = field(default_factory=list)
    parked_at: float = 0.0
    expected_s: float = DEFAULT_TOOL_LATENCY_S
    deadline: float = 0.0
    returned: bool = False

    def chance_of_return(self, now: float) -> float:
        """1 until the expected return time, then falling linearly to 0 at the deadline;
        1 once its next request arrived."""
        if self.returned:
            return 1.0
        expected_at = self.parked_at + self.expected_s
        if now <= expected_at:
            return 1.0
        if now >= self.deadline:
            return 0.0
        return (self.deadline - now) / (self.deadline - expected_at)


class RetentionTable:
    """The parked sessions and their per-session bookkeeping (no block state: the pool owns
    the blocks and asks this table which session to give up).

    Args:
        cap_fraction: Most of the pool retained free blocks may be, in (0, 1].
    """

    def __init__(self, cap_fraction: float = DEFAULT_CAP_FRACTION) -> None:
        if not 0 < cap_fraction <= 1:
            raise InvalidRequestError(f"retention cap must be in (0, 1], got {cap_fraction!r}")
        self.cap_fraction = cap_fraction
        self.sessions: dict[str, RetainedSession] = {}
        self.latency = ToolLatencyEstimator()
        self.num_parked = 0
        self.num_expired = 0
        self.num_given_up = 0

    def victim(self, now: float, block_size: int,
               exclusive_blocks: dict[str, int]) -> str | None:
        """The session to give up first: lowest expected benefit, then earliest deadline.

        Args:
            exclusive_blocks: Per session, its free retained blocks no other session holds
                (the tokens it would recompute are those blocks' tokens).
        """
        best: tuple[float, float, str] | None = None
        for sid, session in self.sessions.items():
            benefit = exclusive_blocks.get(sid, 0) * block_size * session.chance_of_return(now)
            key = (benefit, session.deadline, sid)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def mark_returned(self, session_id: str) -> None:
        """The session's next request arrived (it waits for admission)."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.returned = True

    def expired(self, now: float) -> list[str]:
        """Sessions whose deadline has passed, earliest first."""
        due = [s for s in self.sessions.values() if s.deadline <= now and not s.returned]
        return [s.session_id for s in sorted(due, key=lambda s: s.deadline)]
