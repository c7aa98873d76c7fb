"""The server's bounded queue: at most ``capacity`` requests decoding (the engine's batch)
plus ``max_waiting`` queued behind them; one more is refused (429 with ``Retry-After``)
instead of joining an unbounded queue.
"""

from __future__ import annotations

import threading

from langchain_ascend.serve.http_errors import APIError
from langchain_ascend.validation import check_count, check_int


class Admission:
    """Counts the requests the server holds.

    Args:
        capacity: Requests the engine decodes at once (the chat model's ``max_batch_size``).
        max_waiting: Requests allowed to wait beyond ``capacity`` (>= 0).
        retry_after_s: The ``Retry-After`` a refused client is given.
    """

    def __init__(self, capacity: int, max_waiting: int, *, retry_after_s: int = 1) -> None:
        check_count("capacity", capacity)
        check_int("max_waiting", max_waiting, minimum=0)
        self.capacity = capacity
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Held requests beyond the engine's batch."""
        return max(0, self.in_flight - self.capacity)

    def enter(self) -> None:
        """Admit one request.

        Raises:
            APIError: 429 when ``max_waiting`` requests already wait.
        """
        with self._lock:
            if self.in_flight >= self.capacity + self.max_waiting:
                raise APIError(
                    429, f"the server is full: {self.capacity} requests running and "
                    f"{self.max_waiting} waiting (--max-waiting); retry later",
                    code="queue_full", headers={"Retry-After": str(self.retry_after_s)})
            self.in_flight += 1

    def leave(self) -> None:
        """Release one admitted request."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
