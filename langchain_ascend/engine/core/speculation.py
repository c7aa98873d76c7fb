"""More than one token per forward pass: drafts from the request's own context. Pure Python.

Prompt lookup (:class:`PromptLookup`): the tokens that followed an earlier occurrence of the
request's last n-gram are the draft (agents copy a lot: tool results restated, ids passed on).
One pass checks all drafts and :func:`accept_drafts` keeps the longest prefix greedy decoding
would have produced plus the model's own next token, so greedy output is token-identical with
speculation on or off. Only greedy rows without penalties draft (:func:`can_draft`); under a
grammar the drafts it rejects are dropped before the pass and each verified row is masked by
the grammar's state after the drafts before it (``engine.worker.sampler``), so a reply that
repeats itself (items of a JSON array, a restated tool result) costs fewer passes there too.
:class:`SpeculationState` adapts the draft length per request; ``"auto"`` drafts only while
the acceptance rate beats the cost of an extra row in the step it joins (the measured cost
for a lone request, near 1 in a big batch: ``Scheduler.step_row_cost``), and the engine allows
it only in float32, where a several-row pass rounds like a one-row pass. Details:
docs/performance.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_ascend.engine.core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

FIRST_DRAFT_LENGTH = 2
"""Drafted tokens of a request's first verify pass (then adapted, see the module docstring)."""


def can_draft(params: SamplingParams) -> bool:
    """Whether a request with ``params`` may draft: speculation on, greedy, no penalty (a
    penalty makes each verified token's target depend on the drafts before it). A grammar
    is fine: its rows are verified one after another (module docstring)."""
    return (params.speculation != "off" and params.num_speculative_tokens > 0
            and params.greedy and not params.has_penalties)


def accept_drafts(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a verify pass produces (pure function).

    Args:
        drafts: The ``k`` drafted tokens.
        targets: The model's greedy token after the pending token and after each draft
            (``k + 1`` entries): ``targets[i]`` is what greedy decoding emits once
            ``drafts[:i]`` are accepted.

    Returns:
        ``drafts[:a] + [targets[a]]`` where ``a`` is the number of leading drafts equal to
        their target: between 1 and ``k + 1`` tokens, all of them what greedy decoding would
        have produced one pass at a time.
    """
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"{len(targets)} targets for {len(drafts)} drafts; need drafts + 1")
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return list(targets[:accepted + 1])


def drafted_row_cost(num_rows: int, row_cost: float) -> float:
    """What a drafted row costs in a step of ``num_rows`` decode rows, in tokens that step
    yields (``"auto"`` drafts while its acceptance rate beats this). Pure.

    A step of ``B`` rows costs ``1 + r * (B - 1)`` one-row passes (``r`` = ``row_cost``, one
    row's share of a pass) and yields ``B`` tokens; one more row costs ``r`` and yields its
    acceptance rate ``a``, so it pays while ``a > B * r / (1 + r * (B - 1))``: ``r`` for a
    lone request, near 1 for a big batch, where the products are bound by compute rather than
    by reading the weights and a drafted row displaces a real one.
    """
    rows = max(1, num_rows)
    return rows * row_cost / (1.0 + row_cost * (rows - 1))


class PromptLookup:
    """Incremental n-gram index over one request's growing token list.

    ``index[n]`` maps every n-gram (``min_ngram <= n <= max_ngram``) to the position of its
    last token in its most recent occurrence, over n-grams ending before the list's last token,
    so a hit on the list's own suffix always has at least one following token.

    Args:
        min_ngram: Shortest suffix to match.
        max_ngram: Longest suffix to match (longer matches are tried first).
    """

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)}
        self._next_end = 0  # n-grams ending at positions < this are indexed

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
        matching suffix n-gram of ``tokens``; empty when nothing matches."""
        if k <= 0:
            return []
        last = len(tokens) - 1
        if last < self._next_end:  # the list shrank (a stop string cut it): start over
            for table in self._index.values():
                table.clear()
            self._next_end = 0
        for end in range(self._next_end, last):
            for n, table in self._index.items():
                if end + 1 >= n:
                    table[tuple(tokens[end + 1 - n:end + 1])] = end
        self._next_end = max(self._next_end, last)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(tokens) < n:
                continue
            found = self._index[n].get(tuple(tokens[len(tokens) - n:]))
            if found is not None:
                return list(tokens[found + 1:found + 1 + k])
        return []


class SpeculationState:
    """One request's drafting: the lookup index, the ``"auto"`` pause, and its counters.

    Attributes:
        k: The current draft length (at most ``num_speculative_tokens``).
        draft_tokens: Tokens drafted and checked.
        accepted_tokens: Drafted tokens the check accepted.
        num_verify_steps: Passes that checked drafts.
    """

    AUTO_MAX_ROW_COST = 0.8
    """``"auto"`` does not draft at all where a row costs this share of a pass or more."""
    AUTO_MIN_ACCEPTANCE = 0.25
    """``"auto"`` pauses when the recent acceptance rate (moving average) falls below this."""
    AUTO_FIRST_PAUSE = 8
    AUTO_MAX_PAUSE = 256

    def __init__(self, mode: str, num_speculative_tokens: int) -> None:
        self.mode = mode
        self.max_k = num_speculative_tokens
        self.k = min(FIRST_DRAFT_LENGTH, num_speculative_tokens)  # the current draft length
        self.lookup = PromptLookup()
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.num_verify_steps = 0
        self._recent_rate = 1.0
        self._pause_steps = 0
        self._next_pause = self.AUTO_FIRST_PAUSE

    def propose(self, tokens: Sequence[int], limit: int, *, row_cost: float = 0.0,
                ) -> list[int]:
        """Drafts for the next pass (at most ``min(k, limit)``); empty while paused, and in
        ``"auto"`` mode where a drafted row costs too much (``row_cost``, module docstring)."""
        if self.mode == "auto" and row_cost >= self.AUTO_MAX_ROW_COST:
            return []
        if self._pause_steps > 0:
            self._pause_steps -= 1
            return []
        return self.lookup.propose(tokens, min(self.k, limit))

    def record(self, num_drafted: int, num_accepted: int, *, row_cost: float = 0.0) -> None:
        """Count one verify pass; in ``"auto"`` mode maybe start a pause."""
        self.draft_tokens += num_drafted
        self.accepted_tokens += num_accepted
        self.num_verify_steps += 1
        if num_drafted == 0:
            return
        if num_accepted == num_drafted >= self.k:
            self.k = min(2 * self.k, self.max_k)
        elif 2 * num_accepted < num_drafted:
            self.k = max(1, self.k // 2)
        if self.mode != "auto":
            return
        self._recent_rate = 0.5 * self._recent_rate + 0.5 * (num_accepted / num_drafted)
        if self._recent_rate < max(self.AUTO_MIN_ACCEPTANCE, row_cost):
            self._pause_steps = self._next_pause
            self._next_pause = min(2 * self._next_pause, self.AUTO_MAX_PAUSE)
            self._recent_rate = 0.5  # give the next attempt a fair start
        elif self._recent_rate > 0.5:
            self._next_pause = self.AUTO_FIRST_PAUSE


def configure_drafting(scheduler: Any, runner: Any) -> None:
    """Whether ``speculative_decoding='auto'`` drafts on this runner, and a draft row's cost.

    Greedy identity with drafting holds where a verify pass's rows round exactly as one-row
    decodes: they are packed as decode rows (``engine.worker.packing``), attended by the same
    kernel over the same key ranges, and in float32 every product computes a row the same way
    whatever the batch, float or quantized weights alike (int8 activations are rounded per
    row). In bfloat16/float16 the batched float products round differently and a near-tie can
    flip (measured on CPU bf16). So "auto" drafts in float32; "prompt_lookup" drafts in any
    dtype and format.
    """
    scheduler.auto_drafting = str(runner.dtype) == "torch.float32"
    measure = getattr(runner, "draft_row_cost", None)
    if measure is not None and scheduler.auto_drafting:
        scheduler.draft_row_cost = float(measure())
        logger.info("a drafted token's row costs %.2f of a decode pass on %s %s "
                    "(speculative_decoding='auto' drafts while acceptance beats it)",
                    scheduler.draft_row_cost, runner.device, runner.dtype)
    elif not scheduler.auto_drafting:
        logger.info("speculative_decoding='auto' does not draft in %s (multi-row passes "
                    "round differently from one-row passes); 'prompt_lookup' does",
                    runner.dtype)
