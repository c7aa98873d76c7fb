"""Which tokens of which requests run in the next step. Pure Python, no torch.

One loop covers prefill, chunked prefill, prefix hits and decode: every request has
``num_computed_tokens`` catching up to ``num_tokens`` and each step grants some requests some
tokens within a token budget.

Policy of :meth:`Scheduler.schedule`:

1. Running requests first, decodes before unfinished (chunked) prefills, oldest first (with
   ``"agent"``, the oldest agent's). When the pool cannot give one of them its slots, the
   newest running request not yet scheduled this step is preempted (blocks freed, recomputed
   later with the tokens it generated) - possibly the request itself. A step with decode rows
   computes about ``prefill_beside_decodes`` worth of prefill, running and admitted
   together, charged by attention too with ``prefill_cost_context`` (``core.prefill_share``).
2. Then waiting requests, while budget, batch size and blocks last, in the order of the
   scheduling policy: ``"fcfs"`` first come first served; ``"agent"`` least attained service
   first by session, resuming hops before cold ones, older agents first (``core.agent_policy``).
   A prompt longer than the remaining budget is prefilled in chunks over several steps. When
   the chosen request does not fit, nothing else is admitted; nothing is admitted in a step
   that had to preempt.
3. Background prefills (``Request.prefill_only``: tool results as they land) only in a step
   that would run nothing else, :data:`BACKGROUND_CHUNK` tokens a step (beside other work, or
   in long steps, they delayed hops: ``docs/performance.md``). One is dropped (its computed
   full blocks stay cached) when its session's next hop arrives, to make room for a waiting
   request, or first when the pool must preempt.

Before each step, parked sessions past their TTL are released (``engine.core.retention``). A
request never grows past ``max_model_len`` (which the engine keeps within the pool), so a
request alone in the pool always fits: the scheduler cannot run out of blocks for good.

Speculative decoding (``engine.core.speculation``): a running request that may draft gets its
drafted tokens appended to its segment when the budget and the pool have room for them (drafts
never preempt anyone: without room the request decodes one token). After the step the verified
tokens are appended, and the blocks that held only rejected drafts go back to the pool
(:meth:`KVCacheManager.trim`); only computed - verified - tokens are ever hashed. ``"auto"``
requests weigh a drafted row against the step it joins (:meth:`Scheduler.step_row_cost`): in a
step of many decode rows a drafted row costs about what a whole row's token is worth.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_ascend.engine.core import agent_policy
from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.kv_cache_manager import KVCacheManager
from langchain_ascend.engine.core.prefill_share import PrefillShare
from langchain_ascend.engine.core.request import Request, RequestStatus
from langchain_ascend.engine.core.sampling_params import forced_tokens, grammar_drafts
from langchain_ascend.engine.core.speculation import drafted_row_cost
from langchain_ascend.engine.core.stop_conditions import stop_status
from langchain_ascend.validation import check_choice, check_count, check_number

SCHEDULING_POLICIES = ("fcfs", "agent")
BACKGROUND_CHUNK = 128
"""Most tokens a background prefill computes in one step (a hop arriving waits for it)."""


@dataclass
class StepOutput:
    """What one step did to one request that sampled.

    Attributes:
        request: The request (its status tells whether it finished).
        new_token_ids: The tokens appended this step: one, or several where drafts were
            accepted (cut after a stop condition).
        finished: The request finished this step (its blocks are already freed).
    """

    request: Request
    new_token_ids: list[int]
    finished: bool

    @property
    def new_token_id(self) -> int:
        """The last token appended this step."""
        return self.new_token_ids[-1]


class Scheduler:
    """Queues, token budget and preemption over a :class:`KVCacheManager`.

    Args:
        kv_cache_manager: Owns the blocks.
        max_num_batched_tokens: Token budget of one step (all segments together).
        max_batch_size: Most requests in the running batch.
        max_model_len: Most tokens (prompt + generated) one request may reach; at most the
            pool's capacity.
        clock: Time source for the request timestamps.
        policy: Order of the waiting queue, ``"fcfs"`` or ``"agent"`` (module docstring).
        prefill_beside_decodes: Most prefill tokens of a step with decode rows (module
            docstring, 1); None: the whole budget.
    """

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        *,
        max_num_batched_tokens: int,
        max_batch_size: int,
        max_model_len: int,
        clock: Callable[[], float] = time.monotonic,
        policy: str = "fcfs",
        prefill_beside_decodes: int | None = None,
        prefill_cost_context: float | None = None,
    ) -> None:
        check_choice("scheduling", policy, SCHEDULING_POLICIES)
        check_count("max_num_batched_tokens", max_num_batched_tokens)
        check_count("max_batch_size", max_batch_size)
        check_count("max_model_len", max_model_len)
        if not 0 < max_model_len <= kv_cache_manager.capacity_tokens:
            raise ValueError(f"max_model_len {max_model_len} must be in 1..pool capacity "
                             f"{kv_cache_manager.capacity_tokens}")
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        check_count("prefill_beside_decodes", prefill_beside_decodes, allow_none=True)
        self.prefill_beside_decodes = prefill_beside_decodes or max_num_batched_tokens
        self.prefill_cost_context = check_number("prefill_cost_context", prefill_cost_context,
                                                 minimum=0, open_min=True, allow_none=True)
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.background: deque[Request] = deque()
        self.running: list[Request] = []
        self.policy = policy
        self.background_spans: dict[str, list[tuple[float, float, int]]] = {}
        """Per session, its finished background prefills: ``(start, end, tokens)`` clock
        readings, until taken (``take_background_spans``)."""
        self.attained_service: dict[str, int] = {}
        self.program_age: dict[str, int] = {}
        """For ``"agent"``, per session (or request id without one): the tokens granted so far,
        the arrival rank of its first request."""
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_forced_tokens = 0
        self.draft_row_cost = 0.0
        """What one drafted token's row adds to a pass, in passes (measured by the engine)."""
        self.auto_drafting = True
        """Whether ``speculation="auto"`` requests draft at all (the engine turns it off where
        a multi-row pass does not round like a one-row pass: half-precision weights)."""
        self._finished_ids: list[str] = []
        self._arrivals = itertools.count(1)
        self._scheduled: dict[str, Request] = {}
        self._scheduled_row_cost = 0.0  # step_row_cost of the scheduled step

    def step_row_cost(self, num_rows: int) -> float:
        """What a drafted row costs in a step of ``num_rows`` decode rows
        (:func:`~langchain_ascend.engine.core.speculation.drafted_row_cost`)."""
        return drafted_row_cost(num_rows, self.draft_row_cost)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.background)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already live")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        (self.background if request.prefill_only else self.waiting).append(request)
        if self.policy == "agent":
            agent_policy.note_arrival(request, next(self._arrivals), self.program_age,
                                      self.attained_service, self.requests.values)
        if request.session_id is not None and not request.prefill_only:
            self.kv.pool.retention.mark_returned(request.session_id)  # no expiry while queued
            for other in [*self.background, *self.running]:  # the hop replaces them
                if other.prefill_only and other.session_id == request.session_id:
                    self.finish_request(other, RequestStatus.FINISHED_ABORTED)

    def abort_request(self, request_id: str) -> Request | None:
        """Finish a live request as aborted and free its blocks now; None if not live."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self.finish_request(request, RequestStatus.FINISHED_ABORTED)
        return request

    def finish_request(
        self, request: Request, status: RequestStatus, stop_reason: str | int | None = None
    ) -> None:
        """End a live request (stop string, abort, failure): free blocks, leave the queues."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        if self.requests.get(request.request_id) is not request:
            return
        del self.requests[request.request_id]
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.prefill_only:
            self.background.remove(request)
        else:
            self.waiting.remove(request)
        if request.prefill_only and request.first_scheduled_time is not None:
            spans = self.background_spans.setdefault(request.session_id or "", [])
            spans.append((request.first_scheduled_time, self.clock(),
                          request.num_computed_tokens - request.num_cached_tokens))
            del spans[:-64]  # a session nobody asks about keeps its last few
        self.kv.free(request)
        if request.session_id is None:
            self.attained_service.pop(request.request_id, None)
            self.program_age.pop(request.request_id, None)
        request.status = status
        if stop_reason is not None:
            request.stop_reason = stop_reason
        request.finish_time = self.clock()
        self._finished_ids.append(request.request_id)

    def schedule(self) -> ScheduledBatch:
        """Decide the next step (see the module docstring for the policy)."""
        budget = self.max_num_batched_tokens
        num_new: dict[str, int] = {}
        drafts_of: dict[str, list[int]] = {}
        order: list[Request] = []
        preempted: list[Request] = []

        self.kv.pool.expire_sessions()
        decodes = [r for r in self.running
                   if r.num_tokens - r.num_computed_tokens == 1 and not r.prefill_only]
        prefills = [r for r in self.running
                    if r.num_tokens - r.num_computed_tokens != 1 and not r.prefill_only]
        if idle := not (self.waiting or decodes or prefills):  # background only in such steps
            prefills += [r for r in self.running if r.prefill_only]
        row_cost = self.step_row_cost(len(decodes))
        share = (PrefillShare(self.prefill_beside_decodes, self.prefill_cost_context)
                 if decodes else None)  # alone, prefill takes the whole token budget
        if self.policy == "agent":  # the oldest agent's chunk first (agent_policy, 4.)
            prefills.sort(key=lambda r: self.program_age.get(r.agent, 0))
        for request in decodes + prefills:
            pending = request.num_tokens - request.num_computed_tokens
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            count = min(pending, budget, BACKGROUND_CHUNK if request.prefill_only else budget)
            if pending != 1 and share is not None:
                count = min(count, share.tokens(request.num_computed_tokens))
            if count <= 0:
                continue  # no budget left for it
            drafts = (self._drafts_for(request, budget - count, row_cost)
                      if count == pending else [])
            if not drafts or self.kv.allocate_slots(request, count + len(drafts)) is None:
                drafts = []
                while self.kv.allocate_slots(request, count) is None:
                    victim = self._newest_unscheduled(num_new)
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is request:
                        break
            if request.status is RequestStatus.RUNNING:
                num_new[request.request_id] = count
                if drafts:
                    drafts_of[request.request_id] = drafts
                order.append(request)
                budget -= count + len(drafts)
                if pending != 1 and share is not None:
                    share.take(count, request.num_computed_tokens)

        if not preempted:
            self._admit_waiting(budget, share, num_new, order, idle)
        self._charge_service(order, num_new, drafts_of)
        self._scheduled = {r.request_id: r for r in order}
        self._scheduled_row_cost = row_cost
        return ScheduledBatch(
            segments=[self._segment(r, num_new[r.request_id], drafts_of.get(r.request_id, []))
                      for r in order],
            preempted_ids=[r.request_id for r in preempted],
            finished_ids=self.take_finished_ids(),
        )

    def _admit_waiting(self, budget: int, share: PrefillShare | None, num_new: dict[str, int],
                       order: list[Request], idle: bool) -> None:
        """Admit waiting requests, then - in an ``idle`` step, one - a background prefill
        (module docstring, 2-3) within ``budget`` tokens and, in a step with decodes, the
        prefill ``share`` left into ``num_new`` / ``order``."""
        while ((self.waiting or (idle and self.background and not order)) and budget > 0
               and (share is None or share.left > 0)
               and len(self.running) < self.max_batch_size):
            queue = self.waiting if self.waiting else self.background
            request = self._next_waiting() if self.waiting else self.background[0]
            if request.first_scheduled_time is None and not request.output_token_ids:
                self._append_forced(request)  # a reply that starts with forced text
            hits, num_hit_tokens = self.kv.get_computed_blocks(request)
            if request.prefill_only and num_hit_tokens >= request.num_tokens - 1:
                self.finish_request(request, RequestStatus.FINISHED_STOPPED)
                continue  # all cached already: nothing to prefill
            count = min(request.num_tokens - num_hit_tokens,
                        min(budget, BACKGROUND_CHUNK) if request.prefill_only else budget)
            if share is not None:
                count = min(count, max(1, share.tokens(num_hit_tokens)))
            while self.kv.allocate_slots(request, count, hits) is None:
                victim = None if request.prefill_only else next((r for r in reversed(
                    self.running) if r.prefill_only and r.request_id not in num_new), None)
                if victim is None:
                    return
                self._preempt(victim)  # dropped; its blocks join the free lists, hits stay
            queue.remove(request)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            self.kv.record_prefix_lookup(request.num_tokens, num_hit_tokens)
            self.kv.record_session_admission(request, num_hit_tokens)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = self.clock()
                # Forced text may be cached too: only the prompt's share counts as cached.
                request.num_cached_tokens = min(num_hit_tokens, request.num_prompt_tokens)
            num_new[request.request_id] = count
            order.append(request)
            budget -= count
            if share is not None:
                share.take(count, num_hit_tokens)

    def _charge_service(self, order: list[Request], num_new: dict[str, int],
                        drafts_of: dict[str, list[int]]) -> None:
        """Add this step's tokens to each session's service (and the background counter)."""
        for request in order:
            key = request.agent
            granted = num_new[request.request_id] + len(drafts_of.get(request.request_id, ()))
            self.attained_service[key] = self.attained_service.get(key, 0) + granted
            if request.prefill_only:
                self.kv.session_counters.num_background_tokens += num_new[request.request_id]

    def take_finished_ids(self) -> list[str]:
        """Ids of requests finished since the last call (the runner drops their state)."""
        finished_ids, self._finished_ids = self._finished_ids, []
        return finished_ids

    def discard_scheduled(self) -> dict[str, Request]:
        """Forget the last schedule without applying it (its step failed; the engine fails
        those requests). Returns the requests it had scheduled, by id."""
        scheduled, self._scheduled = self._scheduled, {}
        return scheduled

    def update(self, batch: ScheduledBatch,
               sampled: Sequence[int | Sequence[int] | None]) -> list[StepOutput]:
        """Apply a finished step: advance computed tokens, append sampled (and verified
        drafted) tokens, cache full blocks and finish requests that hit a stop condition.

        Args:
            batch: The step that ran.
            sampled: Per segment: the sampled token id; for a segment with drafts the tokens
                :func:`~langchain_ascend.engine.core.speculation.accept_drafts` kept; None
                where the segment did not sample.

        Segments of requests aborted while the step ran are ignored.
        """
        if len(sampled) != len(batch.segments):
            raise ValueError(f"{len(sampled)} results for {len(batch.segments)} segments")
        outputs: list[StepOutput] = []
        now = self.clock()
        for segment, result in zip(batch.segments, sampled, strict=True):
            request = self._scheduled.get(segment.request_id)
            if request is None or self.requests.get(segment.request_id) is not request:
                continue
            num_known = segment.num_tokens - len(segment.draft_token_ids)
            if not segment.sample:
                request.num_computed_tokens = segment.start_pos + num_known
                self.kv.cache_blocks(request)
                if request.prefill_only and request.num_computed_tokens >= request.num_tokens:
                    self.finish_request(request, RequestStatus.FINISHED_STOPPED)
                continue
            tokens = self._verified_tokens(segment, result)
            appended: list[int] = []  # sampled and accepted tokens
            status = None
            for i, token_id in enumerate(tokens):
                request.append_output_token(token_id)
                appended.append(token_id)
                status = stop_status(request, token_id, self.max_model_len,
                                     grammar=i == len(tokens) - 1)
                if status is not None:
                    break
            # K/V is valid for the known tokens and the accepted drafts before the last token.
            request.num_computed_tokens = segment.start_pos + num_known + len(appended) - 1
            request.num_forward_passes += 1
            self.kv.cache_blocks(request)
            if request.first_token_time is None:
                request.first_token_time = now
            if status is None:
                status = self._append_forced(request)
            if status is not None:
                self.finish_request(request, status)
            elif segment.draft_token_ids:
                self.kv.trim(request)
            # Everything not handed out yet: this step's tokens, and on the first step the
            # tokens a grammar forced before the prompt ran.
            new_token_ids = request.output_token_ids[request.num_reported_tokens:]
            request.num_reported_tokens = request.num_output_tokens
            outputs.append(StepOutput(request, new_token_ids, status is not None))
        self._scheduled = {}
        self.num_steps += 1
        return outputs

    def _verified_tokens(self, segment: ScheduledSegment,
                         result: int | Sequence[int] | None) -> list[int]:
        """The tokens one sampling segment's result appends (checked against its drafts)."""
        if result is None:
            raise ValueError(f"no token sampled for request {segment.request_id}")
        drafts = segment.draft_token_ids
        tokens = [result] if isinstance(result, int) else list(result)
        num_accepted = len(tokens) - 1
        if not 0 <= num_accepted <= len(drafts) or tokens[:num_accepted] != drafts[:num_accepted]:
            raise ValueError(f"request {segment.request_id}: {tokens} is not a verified prefix "
                             f"of the drafts {drafts} plus one token")
        if drafts:
            request = self.requests[segment.request_id]
            if request.speculation is not None:
                request.speculation.record(len(drafts), num_accepted,
                                           row_cost=self._scheduled_row_cost)
            self.num_draft_tokens += len(drafts)
            self.num_accepted_tokens += num_accepted
        return tokens

    def _room_beyond_next(self, request: Request) -> int:
        """Tokens the request may still gain besides one more sampled token, within
        ``max_tokens`` and ``max_model_len`` (drafts and forced tokens stay within it)."""
        return min(request.sampling.max_tokens - request.num_output_tokens - 1,
                   self.max_model_len - request.num_tokens - 1)

    def _append_forced(self, request: Request) -> RequestStatus | None:
        """Append the tokens the request's grammar forces next (jump-forward): they are
        computed with the next pass instead of one pass each. Leaves room for at least one
        sampled token. Off with ``speculation="off"``. Returns the finished status a forced
        token caused, if any."""
        if request.sampling.speculation == "off":
            return None
        status = None
        for token_id in forced_tokens(request.sampling.constraint,
                                      self._room_beyond_next(request)):
            request.append_output_token(token_id)
            request.num_forced_tokens += 1
            self.num_forced_tokens += 1
            status = stop_status(request, token_id, self.max_model_len)
            if status is not None:
                break
        return status

    def _drafts_for(self, request: Request, spare_budget: int, row_cost: float) -> list[int]:
        """Drafted tokens to check after the request's pending token this step (maybe none).

        At most ``spare_budget``, and few enough that the verified tokens cannot pass
        ``max_tokens`` or ``max_model_len``; ``row_cost`` is the step's
        (:meth:`step_row_cost`).
        """
        spec = request.speculation
        if spec is None or (spec.mode == "auto" and not self.auto_drafting):
            return []
        limit = min(spare_budget, self._room_beyond_next(request))
        if limit <= 0:
            return []
        drafts = spec.propose(request.all_token_ids, limit, row_cost=row_cost)
        return grammar_drafts(request.sampling.constraint, drafts)

    def _segment(self, request: Request, count: int, drafts: list[int]) -> ScheduledSegment:
        start = request.num_computed_tokens
        return ScheduledSegment(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start:start + count] + drafts,
            start_pos=start,
            block_ids=self.kv.block_ids(request.request_id),
            sample=start + count == request.num_tokens and not request.prefill_only,
            sampling=request.sampling,
            output_token_ids=request.output_token_ids,
            prompt_token_ids=request.prompt_token_ids,
            draft_token_ids=drafts,
        )

    def _newest_unscheduled(self, scheduled: dict[str, int]) -> Request:
        for request in reversed(self.running):  # background prefills first
            if request.prefill_only and request.request_id not in scheduled:
                return request
        for request in reversed(self.running):
            if request.request_id not in scheduled:
                return request
        raise RuntimeError("no running request left to preempt")

    def _next_waiting(self) -> Request:
        """The waiting request the policy admits next (``engine.core.agent_policy``)."""
        if self.policy == "fcfs":
            return self.waiting[0]
        return agent_policy.next_waiting(self.waiting, service=self.attained_service,
                                         parked=self.kv.pool.retention.sessions,
                                         program_age=self.program_age)

    def _preempt(self, request: Request) -> None:
        if request.prefill_only:  # dropped: what it computed stays cached
            self.finish_request(request, RequestStatus.FINISHED_ABORTED)
            self.num_preemptions += 1
            return
        self.kv.free(request)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
