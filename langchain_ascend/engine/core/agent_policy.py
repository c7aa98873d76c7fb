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
4. the older agent (its first request's arrival) first: agents at one level finish in the
   order they started instead of advancing in lockstep, where on a saturated engine every job
   takes as long as the whole run and every context is live at once. The running prefills
   take the share beside decodes oldest agent first, whatever their level
   (``Scheduler.schedule``): ordered by level first, agents caught up at each level and
   advanced in lockstep again (``docs/performance.md``);
5. the order it waits in.

Tried and not kept (``docs/performance.md``): holding cold requests back from the blocks of
older agents' parked sessions and the youngest agent's session given up first: on 16 agents
of 6 hops over 2 cores the job mean and the recomputed tokens stayed within the runs' noise.
The agent's age (4.) moved nothing either while each step carried a long prefill chunk;
with the chunk beside decodes charged by its cost it halves what is recomputed and more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from langchain_ascend.engine.core.request import Request, RequestStatus

SERVICE_QUANTUM = 256
"""Tokens of service per level (levels double: 256, 512, 1k...)."""
MAX_TRACKED_AGENTS = 65536
"""Agents whose age and service are kept; past it, those with no live request are forgotten,
the oldest first, down to half (a server keyed by ``prompt_cache_key`` sees new sessions for
ever; a forgotten agent that comes back starts over as a new one)."""


def note_arrival(request: Request, arrival: int, program_age: MutableMapping[str, int],
                 service: MutableMapping[str, int], live: Callable[[], Iterable[Request]],
                 ) -> None:
    """Record ``request``'s agent's age (``arrival`` where it is new), forgetting the oldest
    agents without a live request (``live()``) past :data:`MAX_TRACKED_AGENTS`."""
    program_age.setdefault(request.agent, arrival)
    if len(program_age) <= MAX_TRACKED_AGENTS:
        return
    keep = {r.agent for r in live()}
    idle = [key for key in program_age if key not in keep]  # in arrival order
    for key in idle[:len(program_age) - MAX_TRACKED_AGENTS // 2]:
        del program_age[key]
        service.pop(key, None)


def next_waiting(waiting: Iterable[Request], *, service: Mapping[str, int],
                 parked: Mapping[str, Any], program_age: Mapping[str, int]) -> Request:
    """The waiting request the policy admits next; ``service``: tokens granted so far per
    session (or request id without one), ``parked``: the parked sessions by id,
    ``program_age``: the arrival rank of each session's (or request's) first request."""

    def rank(item: tuple[int, Request]) -> tuple[int, int, int, int, int]:
        index, request = item
        sid = request.session_id
        level = (service.get(request.agent, 0) // SERVICE_QUANTUM).bit_length()
        cold = 0 if sid is not None and sid in parked else 1
        age = program_age.get(request.agent, 0)
        return 0 if request.status is RequestStatus.PREEMPTED else 1, level, cold, age, index

    return min(enumerate(waiting), key=rank)[1]
