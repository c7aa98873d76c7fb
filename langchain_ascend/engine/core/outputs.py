"""What the engine hands back to callers. Pure Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class RequestStats:
    """Per-request accounting, filled in by the engine.

    Attributes:
        num_prompt_tokens: Tokens in the prompt.
        num_cached_tokens: Prompt tokens served from the prefix cache (not recomputed) at the
            request's first scheduling.
        num_generated_tokens: Tokens generated (including a stop token that was not returned).
        queue_time: Seconds from arrival to first scheduling.
        time_to_first_token: Seconds from arrival to the first generated token.
        decode_time: Seconds from the first generated token to the end.
        num_preemptions: How often the request was preempted and recomputed.
        num_forward_passes: Steps that gave it new tokens (its tokens per pass is
            ``num_generated_tokens / num_forward_passes``).
        num_draft_tokens: Tokens drafted for it and checked (speculative decoding).
        num_accepted_tokens: Drafted tokens accepted.
        num_forced_tokens: Tokens its grammar forced (jump-forward), appended without a pass.
    """

    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0
    queue_time: float = 0.0
    time_to_first_token: float = 0.0
    decode_time: float = 0.0
    num_preemptions: int = 0
    num_forward_passes: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0


@dataclass
class TokenDelta:
    """One streamed increment of a request's output.

    ``text`` is the newly decoded text (may be empty while a multi-byte character or a
    possible stop string is held back). On the last delta ``finished`` is True and
    ``finish_reason``/``output`` are set.
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    output: RequestOutput | None = None


@dataclass
class RequestOutput:
    """The finished result of one request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    stats: RequestStats = field(default_factory=RequestStats)


@dataclass
class EngineStats:
    """Engine-wide counters.

    Attributes:
        num_blocks_total: KV blocks in the pool.
        num_blocks_used: Blocks referenced by live requests.
        num_blocks_free: Blocks not referenced by any request (includes cached ones).
        num_blocks_cached: Free-or-used blocks that hold a reusable prefix hash.
        prefix_cache_queries: Prompt tokens looked up in the prefix cache.
        prefix_cache_hits: Of those, tokens served from cache.
        num_running: Requests in the running batch.
        num_waiting: Requests queued.
        num_preemptions: Preemptions since start.
        num_steps: Engine steps since start.
        num_draft_tokens: Tokens drafted and checked since start (speculative decoding).
        num_accepted_tokens: Of those, tokens accepted.
        num_forced_tokens: Tokens grammars forced (jump-forward) since start.
        num_retained_sessions: Sessions parked now (their blocks kept while tools run).
        num_retained_blocks: Free blocks those sessions retain (at most
            ``retention_cap_blocks``).
        retention_cap_blocks: The cap on retained blocks.
        num_sessions_parked / num_sessions_expired / num_sessions_given_up: Parkings since
            start, and those that ended at their TTL or were given up under pressure.
        num_resumed: Session requests that came back while parked.
        num_resume_hits: Of those, requests whose prefix hit covered their whole last state.
        num_recomputed_tokens: Tokens of a session's last state that were prefilled again.
        num_background_tokens: Tokens prefilled during tool time (results as they land).
        num_template_fallbacks: Hops whose chat template was not prefix-stable for appended
            tool messages, so their results were prefilled one-shot.
        scheduling: The waiting queue's policy (``"fcfs"`` / ``"agent"``).
        tool_latency_s: The running latency estimate of each measured tool.
        decode_step: What runs pure-decode steps: the plan, the compiled buckets, a failure
            and ``compile="auto"``'s warm-up choice (``engine.worker.compile``); empty for a
            runner without a step compiler.
        weights: The model's weights: ``format`` (``"q4_1+q8_0"``, ``"float32"``...),
            ``bytes``, ``quantized_bytes``, ``linear_formats`` (layers per format) and the
            ``quantization`` mode; empty for a runner that does not say.
    """

    num_blocks_total: int = 0
    num_blocks_used: int = 0
    num_blocks_free: int = 0
    num_blocks_cached: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_forced_tokens: int = 0
    num_retained_sessions: int = 0
    num_retained_blocks: int = 0
    retention_cap_blocks: int = 0
    num_sessions_parked: int = 0
    num_sessions_expired: int = 0
    num_sessions_given_up: int = 0
    num_resumed: int = 0
    num_resume_hits: int = 0
    num_recomputed_tokens: int = 0
    num_background_tokens: int = 0
    num_template_fallbacks: int = 0
    scheduling: str = "fcfs"
    tool_latency_s: dict[str, float] = field(default_factory=dict)
    decode_step: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
