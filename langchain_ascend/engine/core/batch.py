"""The contract between the scheduler (host bookkeeping) and the model runner (device work).

Pure Python, no torch. The scheduler produces a :class:`ScheduledBatch`; the model runner turns
it into one packed forward pass and returns one sampled token per segment that asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from langchain_ascend.engine.core.sampling_params import SamplingParams


@dataclass
class ScheduledSegment:
    """One request's share of a step.

    Invariants:
        * ``token_ids`` are the tokens at positions ``start_pos .. start_pos + len - 1`` of the
          request (prompt then generated tokens); their K/V is written this step.
        * ``block_ids`` is the request's whole block table and covers at least
          ``start_pos + len(token_ids)`` slots (``ceil(n / block_size)`` blocks).
        * ``sample`` is True when the segment ends at the request's last known token, so the
          logits of its last position produce the next token; False for a non-final chunk of a
          chunked prefill.
        * ``output_token_ids`` are the request's generated tokens so far and
          ``prompt_token_ids`` its prompt (the penalties' histories; read-only).
        * ``draft_token_ids`` (speculative decoding) are the last ``len(draft_token_ids)`` of
          ``token_ids``: guesses after the request's last known token, not yet part of the
          request. The step returns the greedy token after the pending token and after each
          draft (``engine.core.speculation.accept_drafts`` keeps the verified ones); a
          segment with drafts always samples, greedily, without penalties; a constrained
          one is verified row by row under its grammar (``engine.worker.sampler``).
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    sampling: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """A single new token after a computed context (no drafts)."""
        return len(self.token_ids) == 1 and self.start_pos > 0


@dataclass
class ScheduledBatch:
    """Everything scheduled for one engine step.

    Attributes:
        segments: Scheduled requests, decodes first, in a stable order.
        preempted_ids: Requests preempted this step (their blocks were freed).
        finished_ids: Requests the model runner may drop per-request state for (aborted or
            finished since the last step).
    """

    segments: list[ScheduledSegment] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    def __bool__(self) -> bool:
        return bool(self.segments)
