"""What a caller asks of one generation. Pure Python, no torch at import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError
from langchain_ascend.validation import (
    as_items,
    check_choice,
    check_count,
    check_flag,
    check_int,
    check_number,
    check_probability,
    is_int,
)

MAX_SEED = 2**63 - 1
"""Largest ``seed``: the sampler seeds a 64-bit ``torch.Generator`` with it."""
SPECULATION_MODES: tuple[str, ...] = ("off", "prompt_lookup", "auto")
"""``SamplingParams.speculation`` values (see ``engine.core.speculation``)."""
MAX_NUM_SPECULATIVE_TOKENS = 16
MAX_ABS_PENALTY = 2.0
"""Bound of ``presence_penalty`` / ``frequency_penalty`` (OpenAI's range, ``[-2, 2]``)."""


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


def grammar_drafts(constraint: TokenConstraint | None, drafts: list[int]) -> list[int]:
    """The leading ``drafts`` a constraint would accept in turn (all of them without one).

    A constraint may offer ``count_accepted(tokens) -> int``: how many leading tokens it would
    accept from its current state, advancing nothing. A draft it rejects could never be
    verified, so its row and every row after it are not computed. Constraints without it
    keep every draft (verification rejects what the grammar does not allow).
    """
    count = getattr(constraint, "count_accepted", None)
    if count is None or not drafts:
        return drafts
    return drafts[:max(0, int(count(drafts)))]


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
        keep_special_token_ids: Special tokens the reply's text keeps (the tool-call and
            reasoning markers its parser reads), however they were produced: sampled,
            drafted or forced. Every other special token is left out of the text.
        repetition_penalty: Hugging Face's: a token already in the prompt or the reply has
            its logit divided by it when positive, multiplied when negative; 1 is off, > 1
            discourages repeats. Applied before the greedy choice too.
        presence_penalty: OpenAI's: subtracted once from the logit of every token the reply
            already holds, in ``[-2, 2]``; 0 is off.
        frequency_penalty: OpenAI's: subtracted from a token's logit once per time the reply
            already holds it, in ``[-2, 2]``; 0 is off.
        min_p: Keep only tokens whose probability (after temperature) is at least ``min_p``
            times the most likely token's, in ``[0, 1]``; 0 is off. Sampled rows only.

    A request with a penalty (:attr:`has_penalties`) takes no greedy shortcut: it never drafts
    (``engine.core.speculation.can_draft``) and its logits always reach the sampler.
    Grammar jump-forward stays on: a forced token is the grammar's only choice, which no
    penalty can change.
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
    keep_special_token_ids: frozenset[int] = frozenset()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0

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
        check_count("max_tokens", self.max_tokens)
        check_number("temperature", self.temperature, minimum=0)
        check_probability("top_p", self.top_p, open_min=True)
        check_int("top_k", self.top_k, minimum=0, what="0 (off) or a positive integer")
        check_penalties(vars(self), allow_none=False)
        check_int("seed", self.seed, minimum=0, maximum=MAX_SEED, allow_none=True)
        self.stop = as_items("stop", self.stop, str_is_item=True, error=InvalidArgumentTypeError,
                             what="a string or a list of non-empty strings")
        for item in self.stop:
            if not isinstance(item, str):
                raise InvalidArgumentTypeError(
                    f"stop must be a string or a list of non-empty strings, got the item "
                    f"{type(item).__name__} {item!r} in {self.stop!r}")
            if not item:
                raise InvalidRequestError(
                    f"stop strings must be non-empty, got {self.stop!r}")
        ids = self.stop_token_ids
        self.stop_token_ids = [ids] if is_int(ids) else as_items(
            "stop_token_ids", ids, str_is_item=False, error=InvalidArgumentTypeError,
            what="a token id or a list of token ids")
        for i, token_id in enumerate(self.stop_token_ids):
            check_int(f"stop_token_ids[{i}]", token_id, minimum=0, what="a token id (an "
                      "integer >= 0)")
        check_flag("ignore_eos", self.ignore_eos)
        check_choice("speculation", self.speculation, SPECULATION_MODES)
        check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0,
                  maximum=MAX_NUM_SPECULATIVE_TOKENS)
        if not isinstance(self.keep_special_token_ids, (set, frozenset, list, tuple)):
            raise InvalidArgumentTypeError(
                f"keep_special_token_ids must be a set of token ids, got "
                f"{type(self.keep_special_token_ids).__name__} {self.keep_special_token_ids!r}")
        for token_id in self.keep_special_token_ids:
            check_int("keep_special_token_ids items", token_id, minimum=0)
        self.keep_special_token_ids = frozenset(self.keep_special_token_ids)
        if self.constraint is not None and not isinstance(self.constraint, TokenConstraint):
            raise InvalidArgumentTypeError(
                f"constraint must be None or a TokenConstraint (mask_logits, accept_token, "
                f"is_terminated), got {type(self.constraint).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether a repetition, presence or frequency penalty changes this request's logits."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def check_penalties(values: Any, *, allow_none: bool = True) -> None:
    """Check the penalty and ``min_p`` values present in ``values`` (a mapping of field or
    argument names; with ``allow_none`` None means "the default" and passes).

    Raises:
        InvalidArgumentTypeError: A value that is not a number (``min_p="0.1"``, a bool).
        InvalidRequestError: ``repetition_penalty`` not > 0, a presence or frequency penalty
            outside ``[-2, 2]``, ``min_p`` outside ``[0, 1]``, NaN or infinity.
    """
    if "repetition_penalty" in values:
        check_number("repetition_penalty", values["repetition_penalty"], minimum=0,
                     open_min=True, allow_none=allow_none)
    for name in ("presence_penalty", "frequency_penalty"):
        if name in values:
            check_number(name, values[name], minimum=-MAX_ABS_PENALTY,
                         maximum=MAX_ABS_PENALTY, allow_none=allow_none)
    if "min_p" in values:
        check_probability("min_p", values["min_p"], allow_none=allow_none)

