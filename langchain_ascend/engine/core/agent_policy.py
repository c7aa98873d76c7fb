"""Whole-agent scheduling (``scheduling="agent"``): which waiting request is admitted next.
Pure Python, no torch.

Policy, stated up front (Autellix's program-level least attained service): a waiting request
ranks by, in turn,

1. preempted before fresh (it held blocks and a place already);
2. the level ``bit_length(service // SERVICE_QUANTUM)`` of the tokens its session (or, without
   one, the request itself) has been granted so far, lowest first: a new agent is not kept
   waiting behind the later hops of long ones, and levels that double keep an agent's hops
   in arrival order once it has run a while;
3. within a level, a resuming hop whose session is parked (its prefix retained) before a cold
   one: it costs only its new tokens, and admitting it ends its hold on the pool;
4. the order it waits in.

Tried and not kept (``docs/performance.md``): holding cold requests back from the blocks of
older agents' parked sessions, the youngest agent's session given up first, and program age
instead of the waiting order within a level: on 16 agents of 6 hops over 2 cores the job
mean and the recomputed tokens stayed within the runs' noise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langchain_ascend.engine.core.request import Request, RequestStatus

SERVICE_QUANTUM = 256
"""Tokens of service per level (levels double: 256, 512, 1k...)."""


def next_waiting(waiting: Iterable[Request], *, service: Mapping[str, int],
                 parked: Mapping[str, Any]) -> Request:
    """The waiting request the policy admits next; ``service``: tokens granted so far per
    session (or request id without one), ``parked``: the parked sessions by id."""

    def rank(item: tuple[int, Request]) -> tuple[int, int, int, int]:
        index, request = item
        sid = request.session_id
        level = (service.get(sid or request.request_id, 0) // SERVICE_QUANTUM).bit_length()
        cold = 0 if sid is not None and sid in parked else 1
        return 0 if request.status is RequestStatus.PREEMPTED else 1, level, cold, index

    return min(enumerate(waiting), key=rank)[1]
