"""One generation request as the engine's host side sees it. Pure Python, no torch.

A request's tokens are its prompt followed by what it generated so far. The scheduler moves
``num_computed_tokens`` (tokens whose K/V sit in the paged cache) towards ``num_tokens``: a
prefix-cache hit jumps it forward, a prefill chunk or a decode step advances it, a preemption
resets it to zero (the generated tokens are kept and recomputed with the prompt).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from langchain_ascend.engine.core.outputs import FinishReason, RequestStats
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.core.speculation import SpeculationState, can_draft


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> FinishReason | None:
        """The caller-facing reason for a finished status, None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISHED = frozenset(
    {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
)
_FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """Host-side state of one request.

    Attributes:
        request_id: Unique among live requests.
        prompt_token_ids: The prompt (never empty).
        sampling: The caller's sampling parameters.
        eos_token_ids: Token ids that end generation unless ``sampling.ignore_eos``.
        arrival_time: Clock reading at submission.
        output_token_ids: Generated tokens, including a final EOS / stop token id.
        all_token_ids: ``prompt_token_ids + output_token_ids``, kept in step.
        num_computed_tokens: Leading tokens whose K/V is in the cache.
        status: See :class:`RequestStatus`.
        block_hashes: Chained hashes of the request's full blocks, filled lazily by the
            KV-cache manager (block ``i`` covers tokens ``i*block_size .. (i+1)*block_size-1``).
        stop_reason: The stop token id or stop string that ended the request, if any.
        last_token_hidden: The last output token ended generation (EOS / stop token id) and is
            not part of what the caller gets back.
        num_cached_tokens: Prompt tokens served from the prefix cache at first scheduling.
        num_preemptions: Times the request was preempted.
        first_scheduled_time, first_token_time, finish_time: Clock readings, None until then.
        speculation: Drafting state when the request may draft (``engine.core.speculation``).
        num_forward_passes: Steps that gave the request new tokens (sampled or drafted).
        num_forced_tokens: Tokens its grammar forced, appended without a pass of their own.
        num_reported_tokens: Output tokens already handed out in step outputs.
        session_id: The agent session the request belongs to (``engine.core.retention``),
            or None.
        prefill_only: A background prefill (tool results as they land): its prompt is
            computed and cached, nothing is sampled, and it runs only when no other request
            waits.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        sampling: SamplingParams,
        *,
        eos_token_ids: Iterable[int] = (),
        arrival_time: float = 0.0,
        session_id: str | None = None,
        prefill_only: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.sampling = sampling
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.stop_token_ids: frozenset[int] = frozenset(sampling.stop_token_ids)
        self.arrival_time = arrival_time
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_hashes: list[bytes] = []
        self.stop_reason: str | int | None = None
        self.last_token_hidden = False
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.speculation = (SpeculationState(sampling.speculation,
                                             sampling.num_speculative_tokens)
                            if can_draft(sampling) else None)
        self.num_forward_passes = 0
        self.num_forced_tokens = 0
        self.num_reported_tokens = 0
        self.session_id = session_id
        self.prefill_only = prefill_only

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens})")

    @property
    def agent(self) -> str:
        """Whom the ``"agent"`` policy accounts this request to: its session, else itself."""
        return self.session_id or self.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def returned_token_ids(self) -> list[int]:
        """Generated tokens the caller gets back (a hidden final stop token left out)."""
        if self.last_token_hidden:
            return self.output_token_ids[:-1]
        return list(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop generated tokens after the first ``num_output_tokens`` (a stop string ended
        the text inside a multi-token step); only valid once the request finished."""
        del self.output_token_ids[num_output_tokens:]
        del self.all_token_ids[self.num_prompt_tokens + num_output_tokens:]

    def stats(self) -> RequestStats:
        """Per-request accounting from the recorded clock readings."""
        arrival = self.arrival_time
        scheduled = self.first_scheduled_time
        first_token = self.first_token_time
        end = self.finish_time
        spec = self.speculation
        return RequestStats(
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            num_generated_tokens=self.num_output_tokens,
            queue_time=(scheduled - arrival) if scheduled is not None else 0.0,
            time_to_first_token=(first_token - arrival) if first_token is not None else 0.0,
            decode_time=(end - first_token) if end is not None and first_token is not None
            else 0.0,
            num_preemptions=self.num_preemptions,
            num_forward_passes=self.num_forward_passes,
            num_draft_tokens=spec.draft_tokens if spec is not None else 0,
            num_accepted_tokens=spec.accepted_tokens if spec is not None else 0,
            num_forced_tokens=self.num_forced_tokens,
        )
