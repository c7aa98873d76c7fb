"""What a caller asks of one generation. Pure Python, no torch at import."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError

MAX_SEED = 2**63 - 1
"""Largest ``seed``: the sampler seeds a 64-bit ``torch.Generator`` with it."""
SPECULATION_MODES: tuple[str, ...] = ("off", "prompt_lookup", "auto")
"""``SamplingParams.speculation`` values (see ``engine.core.speculation``)."""
MAX_NUM_SPECULATIVE_TOKENS = 16


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


def forced_tokens(constraint: TokenConstraint | None, limit: int) -> list[int]:
    """Tokens a constraint forces next (grammar jump-forward), already accepted by it.

    A constraint may offer ``jump_forward(limit) -> list[int]``: at most ``limit`` tokens the
    grammar allows as the only continuation, advanced past. Constraints without it force none.
    """
    jump = getattr(constraint, "jump_forward", None)
    return list(jump(limit)) if jump is not None and limit > 0 else []


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
        speculation: ``"off"``, ``"prompt_lookup"`` (draft from the request's own tokens
            whenever an n-gram matches) or ``"auto"`` (the same, paused while drafts keep
            failing); only greedy rows without a constraint draft (``engine.core.speculation``).
        num_speculative_tokens: Most drafted tokens checked per pass (0 turns drafting off);
            the draft length adapts up to it.
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
    speculation: str = "off"
    num_speculative_tokens: int = 8

    def validate(self) -> None:
        """Check every field before the request runs, so no value fails inside a model step.

        A single ``str`` given as ``stop`` is one stop string and a single int given as
        ``stop_token_ids`` one id (both are turned into one-item lists here); tuples become
        lists.

        Raises:
            InvalidArgumentTypeError: A field of the wrong type (``max_tokens=True``,
                ``top_k=2.7``, ``temperature="0.5"``, ``stop=[1]``, a constraint without the
                :class:`TokenConstraint` methods); the message names the field, the value
                and what is allowed.
            InvalidRequestError: A value out of range (``max_tokens=0``, ``temperature=nan``
                or ``inf``, ``top_p=0``, ``top_k=-1``, ``seed=-1`` or ``>= 2**63``,
                ``stop=[""]``).
        """
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_float("temperature", self.temperature, "a finite number >= 0",
                     lambda v: v >= 0)
        _check_float("top_p", self.top_p, "a finite number in (0, 1]", lambda v: 0 < v <= 1)
        _check_int("top_k", self.top_k, minimum=0, what="0 (off) or a positive integer")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0, maximum=MAX_SEED,
                       what=f"None or an integer in [0, {MAX_SEED}]")
        self.stop = _as_list("stop", self.stop, str)
        for item in self.stop:
            if not isinstance(item, str):
                raise InvalidArgumentTypeError(
                    f"stop must be a string or a list of non-empty strings, got the item "
                    f"{type(item).__name__} {item!r} in {self.stop!r}")
            if not item:
                raise InvalidRequestError(
                    f"stop strings must be non-empty, got {self.stop!r}")
        self.stop_token_ids = _as_list("stop_token_ids", self.stop_token_ids, int)
        for token_id in self.stop_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise InvalidArgumentTypeError(
                    f"stop_token_ids must be a list of token ids (ints), got the item "
                    f"{type(token_id).__name__} {token_id!r} in {self.stop_token_ids!r}")
            if token_id < 0:
                raise InvalidRequestError(
                    f"stop_token_ids must be token ids >= 0, got {token_id!r}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidArgumentTypeError(
                f"ignore_eos must be True or False, got {type(self.ignore_eos).__name__} "
                f"{self.ignore_eos!r}")
        if not isinstance(self.speculation, str) or self.speculation not in SPECULATION_MODES:
            raise InvalidRequestError(
                f"speculation must be one of {list(SPECULATION_MODES)}, got "
                f"{self.speculation!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0,
                   maximum=MAX_NUM_SPECULATIVE_TOKENS)
        if self.constraint is not None and not isinstance(self.constraint, TokenConstraint):
            raise InvalidArgumentTypeError(
                f"constraint must be None or a TokenConstraint (mask_logits, accept_token, "
                f"is_terminated), got {type(self.constraint).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None,
               what: str | None = None) -> None:
    """``value`` is an int (not a bool) in ``[minimum, maximum]``."""
    allowed = what or (f"an integer >= {minimum}" if maximum is None
                       else f"an integer in [{minimum}, {maximum}]")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidRequestError(f"{name} must be {allowed}, got {value!r}")


def _check_float(name: str, value: Any, allowed: str, in_range: Any) -> None:
    """``value`` is a finite int or float (not a bool) for which ``in_range`` holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(
            f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or not in_range(value):
        raise InvalidRequestError(f"{name} must be {allowed}, got {value!r}")


def _as_list(name: str, value: Any, item_type: type) -> list[Any]:
    """A list field as a list: one bare ``item_type`` value is one item, tuples become lists."""
    if isinstance(value, item_type) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise InvalidArgumentTypeError(
        f"{name} must be a list (or one {item_type.__name__}), got {type(value).__name__} "
        f"{value!r}")
