"""What a caller asks of one generation. Pure Python, no torch at import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_ascend.engine.core.util import check_positive
from langchain_ascend.errors import InvalidRequestError


@runtime_checkable
class TokenConstraint(Protocol):
    """Per-request constrained-decoding state (a grammar matcher), driven by the sampler.

    The sampler calls :meth:`mask_logits` on the request's logits row before sampling and
    :meth:`accept_token` with the sampled id. A constraint lives for one request only.
    """

    def mask_logits(self, logits: Any) -> None:
        """Set disallowed entries of ``logits`` (a ``(V,)`` float tensor) to ``-inf`` in place."""

    def accept_token(self, token_id: int) -> None:
        """Advance the grammar by ``token_id``."""

    def is_terminated(self) -> bool:
        """True when the grammar accepts no more tokens (generation must stop)."""


@dataclass
class SamplingParams:
    """Sampling controls for one request.

    Attributes:
        max_tokens: Most tokens to generate; must be >= 1.
        temperature: 0 means greedy (argmax); > 0 samples from softmax(logits / temperature).
        top_p: Nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; 0 disables it.
        seed: Makes a sampled (temperature > 0) request reproducible on its own, whatever else
            is in the batch.
        stop: Stop strings; generation ends when the decoded text contains one. The stop
            string itself is not returned.
        stop_token_ids: Extra token ids that end generation (the token is not returned).
        ignore_eos: Keep generating past the model's EOS tokens (benchmarks).
        constraint: Optional grammar state masking the logits at every step.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    constraint: TokenConstraint | None = None

    def validate(self) -> None:
        """Raise :class:`InvalidRequestError` naming the first bad field."""
        check_positive(allow_none=False, max_tokens=self.max_tokens)
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
