"""One request's grammar state: the engine's ``TokenConstraint`` over an xgrammar matcher.

* ``mask_logits`` fills the matcher's packed next-token bitmask (CPU), removes special tokens
  the grammar does not need, and sets every other token's logit to ``-inf`` on the logits'
  own device;
* a budget guard makes the reply end complete and valid before ``max_tokens`` even for a
  random-weight model (see :class:`XGrammarConstraint`);
* ``accept_token`` advances the matcher; a token the grammar rejects (a sampler that ignored
  the mask) ends the request instead of corrupting the state;
* ``is_terminated`` is true once the matcher accepted a stop token;
* ``count_accepted`` checks drafted tokens on a fork of the matcher (speculative decoding
  verifies a grammar's drafts row by row, ``engine.worker.sampler``);
* the compiled grammar may arrive late (a future from the backend's compile thread): the
  matcher is made when a mask is first needed, at the first sampled token. Before that only
  the spec's forced prefix is appended (``jump_forward``); those tokens are replayed into the
  matcher when it is made.

Masks are kept packed like xgrammar's bitmask (``structured.packed_masks``) so the per-step
work is a few word-wise operations. Imports torch, numpy and xgrammar: load lazily.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xgrammar as xgr

from langchain_ascend.structured.packed_masks import (
    clear_bit,
    has_bit,
    mask_row,
    set_bit,
    set_bit_ids,
    unpack_mask,
)

if TYPE_CHECKING:
    from langchain_ascend.structured.xgrammar_backend import GrammarBackend

__all__ = ["XGrammarConstraint"]

# Budget guard (see XGrammarConstraint). The guard watches once the remaining budget is
# within twice the last estimate of the closing length plus _WATCH_SLACK tokens; between
# estimates it assumes the closing length grows by at most _MAX_GROWTH_PER_TOKEN per token,
# and estimates again when that bound comes within _REESTIMATE_SLACK of the budget;
# it keeps _GUARD_MARGIN tokens spare, simulates at most _MAX_SIMULATED_TOKENS steps, and
# looks one token ahead where the grammar offers at most _LOOKAHEAD_CHOICES tokens besides
# stopping (e.g. "another tool call" vs "stop") and the slack is under _LOOKAHEAD_SLACK.
_WATCH_SLACK = 32
_REESTIMATE_SLACK = 8
_MAX_GROWTH_PER_TOKEN = 2
_GUARD_MARGIN = 2
_MAX_SIMULATED_TOKENS = 512
_LOOKAHEAD_CHOICES = 16
_LOOKAHEAD_SLACK = 64
# Where more than _LOOKAHEAD_CHOICES tokens are allowed and the slack is under
# _UNCHECKED_GROWTH, only tokens whose growth of the closing path is bounded within the slack
# stay (one token can add up to 3 continuation bytes of a character, or 5 of an escape).
_UNCHECKED_GROWTH = 8
_FAVOURITES = 4  # of many such choices, the model's best few (over every safe one) are checked
# Closing policy preference order, inside and outside a JSON string.
_STRING_TIERS = ("quote_colon", "quote_then_closers", "quote_first", "contains_no_opener",
                 "no_opener")
_OUTSIDE_TIERS = ("stop", "closers", "contains_no_opener", "separators", "digits", "no_opener")


class _StringTracker:
    """Follows whether the bytes written so far end inside a JSON string."""

    __slots__ = ("escaped", "in_string")

    def __init__(self, in_string: bool = False, escaped: bool = False) -> None:
        self.in_string = in_string
        self.escaped = escaped

    def copy(self) -> _StringTracker:
        return _StringTracker(self.in_string, self.escaped)

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.escaped:
                self.escaped = False
            elif self.in_string and byte == 0x5C:  # backslash
                self.escaped = True
            elif byte == 0x22:  # double quote
                self.in_string = not self.in_string


class XGrammarConstraint:
    """Per-request grammar state implementing the engine's ``TokenConstraint`` protocol.

    Budget guard. Near the end of its token budget the constraint simulates, on a fork of the
    matcher, a deterministic *closing policy* — inside a JSON string take a token that closes
    it; outside take a stop token, else ``}``/``]``, else a token with a closer and no opener,
    else a ``,``/``:``, else a number, else the longest token that opens nothing — and counts
    the tokens the policy needs to reach a stop token. When the remaining budget is down to
    that count it follows the policy to the end. Before that, where the grammar offers only a
    few tokens besides stopping (such as "start another call"), it drops those after which
    closing would no longer fit; where it offers many and the slack is small, it keeps those
    whose growth of the closing path is bounded within the slack. So the
    reply ends complete and valid instead of being cut off by ``max_tokens``; a model that
    finishes on its own never notices the guard. Where the guard took away the model's
    favourite token (its best-scored one the grammar allowed) before the reply could end, the
    reply is what the budget left of the model's: :attr:`shortened` says so, and the engine
    finishes it as cut by the length.

    Args:
        compiled: An xgrammar ``CompiledGrammar``, or a ``Future`` of one (waited for when
            the matcher is first needed).
        backend: The :class:`GrammarBackend` it was compiled by (vocabulary and masks).
        base_mask: Packed ``(W,)`` mask of tokens ever allowed (special tokens the grammar does
            not use are out).
        max_tokens: The request's token budget (the stop token included).
        report_shortened: Whether :attr:`shortened` may be set (False: a reply the guard
            closed early counts as complete).
        forced_prefix: Text every reply under this grammar starts with
            (:attr:`~langchain_ascend.structured.grammars.GrammarSpec.forced_prefix`): what
            ``jump_forward`` appends while the grammar is still compiling.
    """

    def __init__(
        self, compiled: Any, *, backend: GrammarBackend, base_mask: np.ndarray, max_tokens: int,
        forced_prefix: str = "", report_shortened: bool = True,
    ) -> None:
        self._compiled = compiled
        self._bound_matcher: Any = None  # made from the compiled grammar when first needed
        self._replay: list[int] = []  # tokens accepted before the matcher existed
        self._forced_prefix = forced_prefix
        self._backend = backend
        self._vocab_size = backend.vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, self._vocab_size)  # (1, W) int32
        self._scratch = xgr.allocate_token_bitmask(1, self._vocab_size)  # (1, W) int32
        self._base = base_mask  # (W,)
        self._strings = _StringTracker()
        self._max_tokens = max_tokens
        self._closing = False
        self._needed: int | None = None  # last estimate of the closing length
        self._estimated_at = 0  # num_accepted at that estimate
        self._path: list[int] | None = None  # the closing path from here, when known
        self._choice_paths: dict[int, list[int]] = {}  # lookahead paths of this step's choices
        self.num_accepted = 0
        self.rejected_token: int | None = None
        self.shortened = False  # the guard took the model's favourite token away
        self._report_shortened = report_shortened

    @property
    def closing(self) -> bool:
        """True once the budget guard follows the closing policy."""
        return self._closing

    @property
    def has_matcher(self) -> bool:
        """Whether the grammar was awaited and its matcher made (at the first mask)."""
        return self._bound_matcher is not None

    @property
    def _matcher(self) -> Any:
        """The xgrammar matcher; made on first use, waiting for the compile if it still runs,
        with the tokens accepted before replayed into it."""
        if self._bound_matcher is None:
            compiled = self._compiled
            if isinstance(compiled, Future):
                compiled = compiled.result()
            matcher = xgr.GrammarMatcher(compiled)
            for token_id in self._replay:
                if not matcher.accept_token(token_id):
                    self.rejected_token = token_id
                    break
            self._replay = []
            self._compiled = compiled
            self._bound_matcher = matcher
        return self._bound_matcher

    def _grammar_pending(self) -> bool:
        """True while there is no matcher yet and the compile is still running."""
        return (self._bound_matcher is None and isinstance(self._compiled, Future)
                and not self._compiled.done())

    # -- packed-mask helpers -----------------------------------------------------------------

    def _allowed_packed(self, matcher: Any, bitmask: torch.Tensor) -> np.ndarray:
        matcher.fill_next_token_bitmask(bitmask)
        return bitmask.numpy()[0] & self._base  # (W,)

    def _policy_choice(self, allowed: np.ndarray, in_string: bool) -> int:
        """The closing policy's token among the packed ``allowed`` mask."""
        masks = self._backend.policy_masks
        candidates = allowed
        for tier in _STRING_TIERS if in_string else _OUTSIDE_TIERS:
            tiered = allowed & masks[tier]  # (W,)
            if tiered.any():
                candidates = tiered
                break
        ids = set_bit_ids(candidates, self._vocab_size)
        if ids.size == 0:
            return self._backend.stop_token_ids[0]
        return int(ids[np.argmax(self._backend.token_lengths[ids])])

    def _is_stop(self, token_id: int) -> bool:
        return token_id in self._backend.stop_token_ids

    def _simulate_close(self, limit: int, first_token: int | None = None) -> list[int] | None:
        """The closing policy's tokens from here to a stop token (inclusive).

        With ``first_token`` the path starts with that token. ``None`` when the path is longer
        than ``limit`` tokens.
        """
        matcher = self._matcher.fork()
        strings = self._strings.copy()
        path: list[int] = []
        if first_token is not None:
            if not matcher.accept_token(first_token):
                return None
            strings.feed(self._backend.decoded_vocab[first_token])
            path.append(first_token)
        while len(path) < limit:
            token = self._policy_choice(
                self._allowed_packed(matcher, self._scratch), strings.in_string
            )
            path.append(token)
            if self._is_stop(token):
                return path
            if not matcher.accept_token(token):
                return None
            strings.feed(self._backend.decoded_vocab[token])
        return None

    def _estimate(self, limit: int) -> int:
        """Refresh the closing path; returns its length (``limit`` when longer)."""
        self._path = self._simulate_close(limit)
        self._estimated_at = self.num_accepted
        self._needed = len(self._path) if self._path is not None else limit
        return self._needed

    def _guard(self, allowed: np.ndarray, scores: np.ndarray | None = None,
               row: Callable[[], np.ndarray] | None = None) -> np.ndarray:
        """Apply the budget guard to the packed ``allowed`` mask (may switch to closing);
        ``scores``: the step's logits row where known (the model's favourites are checked)."""
        self._choice_paths = {}
        remaining = self._max_tokens - self.num_accepted  # tokens left, this one included
        limit = min(remaining + 1, _MAX_SIMULATED_TOKENS)
        if self._needed is None:
            self._estimate(_MAX_SIMULATED_TOKENS)
        needed = self._needed if self._needed is not None else _MAX_SIMULATED_TOKENS
        growth = 0
        if self._path is None:
            growth = _MAX_GROWTH_PER_TOKEN * (self.num_accepted - self._estimated_at)
        if remaining > 2 * (needed + growth) + _WATCH_SLACK:
            return allowed
        if self._path is None and remaining <= needed + growth + _GUARD_MARGIN + _REESTIMATE_SLACK:
            needed, growth = self._estimate(limit), 0
        if remaining <= needed + _GUARD_MARGIN:
            self._closing = True
            return allowed
        slack = remaining - needed - growth - _GUARD_MARGIN
        if slack >= _LOOKAHEAD_SLACK:
            return allowed
        stop = self._backend.policy_masks["stop"]
        choices = set_bit_ids(allowed & ~stop, self._vocab_size)
        total = choices.size + int((allowed & stop).any())
        if total < 2:
            return allowed
        forced = self._matcher.find_jump_forward_string().encode()
        if forced and slack >= len(forced) and choices.size <= _LOOKAHEAD_CHOICES:
            # Forced bytes: a token inside them costs at most a token a byte, so within the
            # slack the model's own split stands; a token reaching past them is checked.
            vocab = self._backend.decoded_vocab
            past = np.array([t for t in choices.tolist() if not forced.startswith(vocab[t])],
                            dtype=np.int64)
            self._keep_fitting(allowed, past, limit, remaining)
            return allowed
        if choices.size > _LOOKAHEAD_CHOICES:
            if slack >= _UNCHECKED_GROWTH:
                return allowed
            return self._keep_bounded_growth(allowed, slack, limit, remaining,
                                             row() if scores is None and row else scores)
        self._keep_fitting(allowed, choices, limit, remaining)
        return allowed

    def _keep_fitting(self, allowed: np.ndarray, choices: np.ndarray, limit: int,
                      remaining: int) -> None:
        """Clear from ``allowed`` each of ``choices`` after which closing no longer fits."""
        for token in choices.tolist():
            if self._path is not None and self._path[0] == token:
                continue  # on the closing path: fits by construction
            path = self._simulate_close(limit, first_token=token)
            if path is None or len(path) > remaining - _GUARD_MARGIN:
                clear_bit(allowed, token)  # taking it would leave no room to close
            else:
                self._choice_paths[token] = path

    def _keep_bounded_growth(self, allowed: np.ndarray, slack: int, limit: int,
                             remaining: int, scores: np.ndarray | None) -> np.ndarray:
        """Too many choices to look ahead one by one, with little slack: keep the tokens that
        cannot lengthen the closing path past ``slack`` (plain text inside a string, digits
        or closers outside: a multi-byte character's first byte can cost 3 more tokens, an
        escape 5), the closing path's next token, and the rest only where a lookahead shows
        they fit: all of them when few, else the model's favourites (best ``scores``)."""
        masks = self._backend.policy_masks
        if self._strings.in_string and not self._strings.escaped:
            bound = max((g for g in (0, 3, 5) if g <= slack), default=0)
            safe = allowed & masks[f"grows_{bound}_in_string"]  # (W,)
        else:
            safe = allowed & (masks["grows_0_outside"] | masks["stop"])  # (W,)
        others = set_bit_ids(allowed & ~safe & ~masks["stop"], self._vocab_size)
        if others.size > _LOOKAHEAD_CHOICES and scores is not None and others[-1] < scores.size:
            kept = set_bit_ids(safe, scores.size)
            floor = scores[kept].max() if kept.size else -np.inf
            best = others[np.argpartition(-scores[others], _FAVOURITES)[:_FAVOURITES]]
            others = best[scores[best] > floor]  # preferred to every safe one
        if others.size <= _LOOKAHEAD_CHOICES:
            fitting = allowed & ~allowed  # (W,) zeros, then the looked-ahead ones that fit
            for token in others.tolist():
                set_bit(fitting, token)
            self._keep_fitting(fitting, others, limit, remaining)
            safe |= fitting
        if self._path is None:
            self._estimate(limit)
        if self._path:
            set_bit(safe, self._path[0])
        return safe if safe.any() else allowed

    # -- TokenConstraint protocol ------------------------------------------------------------

    def allowed_token_ids(self) -> np.ndarray:
        """Ids of the tokens allowed next (advances nothing; runs the budget guard)."""
        return set_bit_ids(self._next_allowed(), self._vocab_size)

    def _next_allowed(self, scores: np.ndarray | None = None,
                      row: Callable[[], np.ndarray] | None = None) -> np.ndarray:
        """The packed next-token mask, guarded; ``scores`` / ``row``: the logits row (or a
        fetch of it), for :attr:`shortened`."""
        row = functools.cache(row) if scores is None and row else row  # one copy of a row
        grammar = self._allowed_packed(self._matcher, self._bitmask)  # (W,)
        allowed = grammar.copy() if not self._closing else grammar  # the guard edits in place
        if not self._closing:
            allowed = self._guard(allowed, scores, row)
        if self._closing:
            if self._path:
                choice = self._path[0]
            else:
                choice = self._policy_choice(allowed, self._strings.in_string)
            forced = np.zeros_like(allowed)  # (W,)
            set_bit(forced, choice)
            allowed = forced
        elif not allowed.any():
            return self._backend.policy_masks["stop"].copy()
        if (self._report_shortened and not self.shortened  # (a guard stopping a complete
                and not (grammar & self._backend.policy_masks["stop"]).any()  # reply is not)
                and not np.array_equal(allowed, grammar)):
            self.shortened = self._favourite_taken(grammar, allowed, scores, row)
        return allowed

    def _favourite_taken(self, grammar: np.ndarray, allowed: np.ndarray,
                         scores: np.ndarray | None,
                         row: Callable[[], np.ndarray] | None) -> bool:
        """Whether the best-scored token of ``grammar`` is out of ``allowed`` (both packed
        ``(W,)``; without scores, whether anything is)."""
        scores = row() if scores is None and row is not None else scores
        ids = set_bit_ids(grammar, self._vocab_size if scores is None else scores.size)
        if scores is None or not ids.size:
            return True
        return not has_bit(allowed, int(ids[np.argmax(scores[ids])]))

    def mask_logits(self, logits: Any) -> None:
        """Set disallowed entries of ``logits`` (``(V,)``, any device) to ``-inf`` in place.

        A contiguous float32 CPU row is masked on one thread, never by torch's element-wise
        ops (over a 49k row they go parallel and cost 0.3-25 ms each on a busy 2-core host):
        a sparse mask by :func:`mask_row`, a nearly open one by xgrammar's kernel straight
        from the packed words; other rows through an unpacked bool mask on their device."""
        width = min(int(logits.shape[-1]), self._vocab_size)
        cpu_row = (logits.device.type == "cpu" and logits.dtype == torch.float32
                   and logits.dim() == 1 and logits.is_contiguous())
        packed = self._next_allowed(  # (W,)
            logits.numpy()[:width] if cpu_row else None,
            row=lambda: logits[:width].detach().float().cpu().numpy())
        # The row may be an inference tensor (made under torch.inference_mode), which may
        # only be edited in place inside inference mode; a normal tensor is fine there too.
        with torch.inference_mode():
            if width < logits.shape[-1]:
                logits[..., width:] = float("-inf")
            if cpu_row:
                if mask_row(logits.numpy(), packed, width):
                    return
                xgr.apply_token_bitmask_inplace(
                    logits.view(1, -1), torch.from_numpy(packed).view(1, -1),
                    vocab_size=width, backend="cpu")
                return
            allowed = torch.from_numpy(unpack_mask(packed, self._vocab_size))  # (V,)
            disallowed = (~allowed[:width]).to(logits.device, non_blocking=True)  # (V,)
            logits[..., :width].masked_fill_(disallowed, float("-inf"))

    def accept_token(self, token_id: int) -> None:
        """Advance the grammar by ``token_id``."""
        self._advance(token_id, defer=False)

    def _advance(self, token_id: int, *, defer: bool) -> None:
        """Advance by ``token_id``; with ``defer`` (forced text appended while the grammar
        is compiling) the matcher check waits until the matcher is made."""
        self.num_accepted += 1
        if self._path and self._path[0] == token_id:
            self._path = self._path[1:]  # still on the closing path: one token shorter
        elif token_id in self._choice_paths:
            self._path = self._choice_paths[token_id][1:]  # the path looked ahead for it
        else:
            self._path = None
        self._choice_paths = {}
        if self._path is not None:
            self._needed = len(self._path)
            self._estimated_at = self.num_accepted
        if self.rejected_token is not None:
            return
        if defer and self._bound_matcher is None:
            self._replay.append(int(token_id))  # checked when the matcher is made
        elif not self._matcher.accept_token(int(token_id)):
            self.rejected_token = int(token_id)
            return
        if 0 <= token_id < self._vocab_size:
            self._strings.feed(self._backend.decoded_vocab[token_id])

    def jump_forward(self, limit: int) -> list[int]:
        """Tokens of the text the grammar forces next, accepted here; the engine appends them
        without a forward pass each (they are computed together in the next pass).

        The forced text (xgrammar's jump-forward string, e.g. ``", "arguments": {"`` after a
        forced tool name) is tokenized by the model's tokenizer, so the tokens are the ones
        the tokenizer produces for that text, not a greedy longest-token split. Its last token
        is left to the model: the text after the forced part may merge with it. Nothing jumps
        while the budget guard is closing the reply, or when the tokens would not spell the
        forced text exactly (a tokenizer that adds a prefix space, a split character).

        At the start the spec's forced prefix is used, whether or not the grammar has compiled
        (the scheduler asks before the prompt's prefill, often while it compiles: the compile
        is not waited for, and a reply does not depend on when it finished); without one the
        grammar is waited for here.

        Args:
            limit: Most tokens to return.
        """
        if limit <= 0 or self._closing or self.rejected_token is not None:
            return []
        at_start = bool(self._forced_prefix) and self.num_accepted == 0
        defer = at_start and self._grammar_pending()
        if at_start:  # compiled or not: the same tokens whatever the compile's timing
            text = self._forced_prefix
        else:
            if self._matcher.is_terminated():
                return []
            text = self._matcher.find_jump_forward_string()
        if not text:
            return []
        tokens = list(self._backend.tokenizer.encode(text, add_special_tokens=False))[:-1]
        tokens = tokens[:limit]
        if not tokens:
            return []
        vocab = self._backend.decoded_vocab
        if any(not 0 <= t < self._vocab_size for t in tokens) or not text.encode(
                "utf-8").startswith(b"".join(vocab[t] for t in tokens)):
            return []
        budget_left = self._max_tokens - self.num_accepted - len(tokens)
        if self._needed is not None and budget_left <= self._needed + 1:
            return []  # leave the guard its room to close the reply
        if self._bound_matcher is not None:
            fork = self._bound_matcher.fork()
            if not all(fork.accept_token(t) for t in tokens):
                return []
        for token_id in tokens:
            self._advance(token_id, defer=defer)
        return tokens

    def count_accepted(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` (drafts) the grammar would accept in turn from here,
        advancing nothing; none while the budget guard closes the reply (it takes its own
        path) or the grammar still compiles (drafting must not wait for it)."""
        if self._closing or self.rejected_token is not None or self._grammar_pending():
            return 0
        fork = self._matcher.fork()
        for count, token_id in enumerate(tokens):
            if not 0 <= token_id < self._vocab_size or not fork.accept_token(int(token_id)):
                return count
            if fork.is_terminated():
                return count + 1
        return len(tokens)

    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token (or rejected a token). Before the
        matcher exists only forced text was accepted, which ends nothing."""
        if self.rejected_token is not None:
            return True
        return self._bound_matcher is not None and self._bound_matcher.is_terminated()

    def is_completed(self) -> bool:
        """True when the text so far is a complete match (a stop token may follow)."""
        return self._matcher.is_completed()
