"""Batched next-token choice: penalties, greedy, temperature, top-k, top-p, min-p, constraints.

One call per engine step over the ``(S, V)`` logits of the sampling segments, with ONE
device->host copy (the final ``tolist()`` of the chosen ids). Greedy, temperature, top-k and
top-p rows are handled by batched tensor ops over all rows at once (no per-row torch op).

Sampling is an exponential race: ``argmax(probs / E)`` with ``E ~ Exp(1)`` independent per
vocabulary entry picks token ``j`` with probability ``probs[j]``. The noise is counter-based:
every sampled request owns a host ``random.Random`` (seeded from ``SamplingParams.seed``, or
from OS entropy when unset, kept across steps until :meth:`Sampler.release`) that gives one
64-bit key per step; the ``(R, V)`` uniforms are a hash of ``(key, vocab index)`` computed on
the device in one batch (:func:`uniform_noise`). So a request's tokens depend only on its own
logits and its own generator, never on which other requests share the batch.

Penalties (repetition, presence, frequency: ``engine.worker.penalties``) change the logits of
the rows that carry one before anything else, greedy rows included.

Constraints: ``constraint.mask_logits(row)`` edits the request's logits row in place before
the choice; ``constraint.accept_token(token)`` is called with the chosen id afterwards. A
constrained segment with drafted tokens is verified row by row (:func:`verify_under_constraint`):
each row's mask is the grammar's state after the drafts before it.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from langchain_ascend.engine.core.sampling_params import SamplingParams, TokenConstraint
from langchain_ascend.engine.worker.penalties import apply_penalties

if TYPE_CHECKING:
    import torch


def greedy_ids(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of ``logits`` ``(S, V)`` (lowest id on ties, a NaN wins, as
    ``torch.argmax``). Float32 rows on the CPU go through numpy: one 49k-token row takes
    ~7 us there against ~85 us for torch's reduction, which wakes its thread pool for it."""
    import torch

    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return np.asarray(logits).argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def filter_logits(logits: torch.Tensor, temperatures: Sequence[float], top_ks: Sequence[int],
                  top_ps: Sequence[float], min_ps: Sequence[float] | None = None,
                  ) -> torch.Tensor:
    """Temperature-scale, then keep each row's top-k, its top-p nucleus and the tokens at
    least ``min_p`` times as likely as its best (in that order, as transformers' warpers;
    pure function).

    Args:
        logits: ``(R, V)`` float32 logits of the sampled rows.
        temperatures: ``R`` positive temperatures.
        top_ks: ``R`` top-k values; 0 keeps every token.
        top_ps: ``R`` nucleus masses in (0, 1]; 1 keeps every token.
        min_ps: ``R`` min-p shares in [0, 1]; 0 (or None for all rows) keeps every token.

    Returns:
        ``(R, V)`` scaled logits with filtered-out entries set to ``-inf``. The most likely
        token of a row always survives.
    """
    import torch

    device = logits.device
    scaled = logits / torch.tensor(temperatures, dtype=logits.dtype, device=device)[:, None]
    vocab = scaled.shape[-1]
    need_k = any(0 < k < vocab for k in top_ks)
    need_p = any(p < 1 for p in top_ps)
    need_min_p = min_ps is not None and any(p > 0 for p in min_ps)
    if not (need_k or need_p or need_min_p):
        return scaled  # (R, V)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # (R, V)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)  # (R, V)
    if need_k:
        ranks = torch.arange(vocab, device=device)  # (V,)
        k = torch.tensor([k if k > 0 else vocab for k in top_ks], device=device)  # (R,)
        drop |= ranks[None, :] >= k[:, None]
    if need_p:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)  # (R, V)
        mass_before = probs.cumsum(dim=-1) - probs  # (R, V) mass of strictly likelier tokens
        top_p = torch.tensor(top_ps, dtype=probs.dtype, device=device)  # (R,)
        drop |= mass_before >= top_p[:, None]
    if need_min_p:
        assert min_ps is not None
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)  # (R, V)
        min_p = torch.tensor(min_ps, dtype=probs.dtype, device=device)  # (R,)
        drop |= probs < min_p[:, None] * probs[:, :1]  # column 0 holds each row's best
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)  # (R, V)


_MASK62 = (1 << 62) - 1


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 62-bit integer hash round (xor-shift-multiply) on non-negative int64 values."""
    x = x ^ (x >> 31)
    x = (x * 0x7FB5D329728EA185) & _MASK62
    x = x ^ (x >> 27)
    x = (x * 0x1B873593) & _MASK62
    return x ^ (x >> 33)


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """``(R, V)`` float32 uniforms in (0, 1), a pure function of each row's key (pure function).

    Args:
        keys: ``(R,)`` int64 in ``[0, 2**62)``, one per row.
        vocab: ``V``.
    """
    import torch

    index = torch.arange(vocab, dtype=torch.long, device=keys.device)  # (V,)
    x = (keys[:, None] * 0x9E3779B1 + index[None, :] * 0x2545F491 + 1) & _MASK62  # (R, V)
    x = _mix(_mix(x))
    # 23 bits: (bits + 0.5) / 2**23 is exact in float32, so u < 1 strictly. With 24 bits the
    # top value rounds to 1.0, its Exp(1) draw is 0, and a masked token's 0 / 0 = NaN wins
    # the argmax race.
    bits = (x >> 39) & 0x7FFFFF  # (R, V) 23 bits
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


def verify_under_constraint(logits: torch.Tensor, drafts: Sequence[int],
                            constraint: TokenConstraint) -> list[int]:
    """The greedy targets of a constrained verify pass, each row masked by the grammar's state
    after the drafts before it.

    Row ``i`` is masked and chosen only once ``drafts[:i]`` were all accepted (the constraint
    advanced over them), so the constraint ends having accepted exactly the tokens
    :func:`~langchain_ascend.engine.core.speculation.accept_drafts` keeps: the matched drafts
    and the first target that differs (or the last row's), never a rejected draft; no rollback
    is needed. Rows after the first mismatch, or after a token that ends the grammar, are not
    chosen: their targets are ``-1``, which matches no draft.

    Args:
        logits: ``(k + 1, V)`` float32 logits of the pending token's row and each draft's row,
            edited in place by the masks.
        drafts: The ``k`` drafted tokens.
        constraint: The segment's grammar state.

    Returns:
        ``k + 1`` targets for :func:`~langchain_ascend.engine.core.speculation.accept_drafts`.
    """
    targets = [-1] * (len(drafts) + 1)
    for i in range(len(drafts) + 1):
        row = logits[i]  # (V,)
        constraint.mask_logits(row)
        token = greedy_ids(row[None])[0]
        constraint.accept_token(token)
        targets[i] = token
        if i == len(drafts) or token != drafts[i] or constraint.is_terminated():
            break
    return targets


class Sampler:
    """Chooses one token per row of the step's logits.

    Args:
        device: Where logits live (the noise is computed there).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.req_to_generator: dict[str, random.Random] = {}

    def generator_for(self, request_id: str, seed: int | None) -> random.Random:
        """The request's generator, created on first use from ``seed`` (or OS entropy)."""
        gen = self.req_to_generator.get(request_id)
        if gen is None:
            gen = random.Random(seed if seed is not None else secrets.randbits(63))
            self.req_to_generator[request_id] = gen
        return gen

    def release(self, request_ids: Iterable[str]) -> None:
        """Forget the generators of finished or aborted requests."""
        for request_id in request_ids:
            self.req_to_generator.pop(request_id, None)

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               request_ids: Sequence[str],
               histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
               verify: Sequence[tuple[int, Sequence[int]]] = (),
               ) -> list[int]:
        """Pick the next token of every row.

        Args:
            logits: ``(S, V)`` next-token logits, one row per request (any float dtype).
            params: Each row's sampling parameters.
            request_ids: Each row's request id (keys the per-request generator).
            histories: Each row's ``(prompt_ids, output_ids)`` so far; needed only when a row
                has a penalty (:attr:`SamplingParams.has_penalties`).
            verify: ``(first_row, drafts)`` of each constrained segment with drafts: its
                ``len(drafts) + 1`` greedy rows from ``first_row`` on are chosen by
                :func:`verify_under_constraint` (their entries are its targets).

        Returns:
            ``S`` token ids (the step's single device->host copy).
        """
        import torch

        logits = logits.float()  # (S, V); a copy for bf16/fp16, masks edit it in place
        apply_penalties(logits, params, histories)  # rows with a penalty, in place
        verified = {row for first, drafts in verify
                    for row in range(first, first + len(drafts) + 1)}
        constrained = [(i, p.constraint) for i, p in enumerate(params)
                       if p.constraint is not None and i not in verified]
        for i, constraint in constrained:
            constraint.mask_logits(logits[i])
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled_rows:
            token_ids = greedy_ids(logits)
        else:
            chosen = logits.argmax(dim=-1)  # (S,)
            picked = [params[i] for i in sampled_rows]
            keys = [self.generator_for(request_ids[i], params[i].seed).getrandbits(62)
                    for i in sampled_rows]
            rows = torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)  # (R,)
            probs = filter_logits(
                logits.index_select(0, rows),  # (R, V)
                [p.temperature for p in picked], [p.top_k for p in picked],
                [p.top_p for p in picked], [p.min_p for p in picked]).softmax(dim=-1)  # (R, V)
            exponential = (-torch.log(uniform_noise(
                torch.tensor(keys, dtype=torch.long, device=logits.device),
                logits.shape[-1]))).clamp_min_(torch.finfo(torch.float32).tiny)  # (R, V) Exp(1) > 0
            chosen.index_copy_(0, rows, (probs / exponential).argmax(dim=-1))
            token_ids = chosen.tolist()
        for i, constraint in constrained:
            constraint.accept_token(token_ids[i])
        for first, drafts in verify:
            constraint = params[first].constraint
            assert constraint is not None and params[first].greedy
            rows = slice(first, first + len(drafts) + 1)
            token_ids[rows] = verify_under_constraint(logits[rows], drafts, constraint)
        return token_ids
