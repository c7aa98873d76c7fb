"""Batched next-token choice: greedy, temperature, top-k, top-p, constraints.

One call per engine step over the ``(S, V)`` logits of the sampling segments, with ONE
device->host copy (the final ``tolist()`` of the chosen ids).

Reproducibility: every sampled request draws from its own ``torch.Generator`` (seeded from
``SamplingParams.seed``, or from OS entropy when unset), kept across steps until
:meth:`Sampler.release`. Filtering is row-wise, so a request's tokens depend only on its own
logits and generator, never on which other requests share the batch.

Constraints: ``constraint.mask_logits(row)`` edits the request's logits row in place before
the choice; ``constraint.accept_token(token)`` is called with the chosen id afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from langchain_ascend.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


def filter_logits(logits: torch.Tensor, temperatures: Sequence[float], top_ks: Sequence[int],
                  top_ps: Sequence[float]) -> torch.Tensor:
    """Temperature-scale, then keep each row's top-k and top-p nucleus (pure function).

    Args:
        logits: ``(R, V)`` float32 logits of the sampled rows.
        temperatures: ``R`` positive temperatures.
        top_ks: ``R`` top-k values; 0 keeps every token.
        top_ps: ``R`` nucleus masses in (0, 1]; 1 keeps every token.

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
    if not (need_k or need_p):
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
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)  # (R, V)


class Sampler:
    """Chooses one token per row of the step's logits.

    Args:
        device: Where logits live; generators are created there.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.req_to_generator: dict[str, torch.Generator] = {}

    def generator_for(self, request_id: str, seed: int | None) -> torch.Generator:
        """The request's generator, created on first use from ``seed`` (or OS entropy)."""
        import torch

        gen = self.req_to_generator.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed if seed is not None else secrets.randbits(63))
            self.req_to_generator[request_id] = gen
        return gen

    def release(self, request_ids: Iterable[str]) -> None:
        """Forget the generators of finished or aborted requests."""
        for request_id in request_ids:
            self.req_to_generator.pop(request_id, None)

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               request_ids: Sequence[str]) -> list[int]:
        """Pick the next token of every row.

        Args:
            logits: ``(S, V)`` next-token logits, one row per request (any float dtype).
            params: Each row's sampling parameters.
            request_ids: Each row's request id (keys the per-request generator).

        Returns:
            ``S`` token ids (the step's single device->host copy).
        """

        logits = logits.float()  # (S, V); a copy for bf16/fp16, masks edit it in place
        constrained = [(i, p.constraint) for i, p in enumerate(params) if p.constraint is not None]
        for i, constraint in constrained:
            constraint.mask_logits(logits[i])
        chosen = logits.argmax(dim=-1)  # (S,)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            chosen[sampled_rows] = self._sample_rows(logits, params, request_ids, sampled_rows)
        token_ids = chosen.tolist()
        for i, constraint in constrained:
            constraint.accept_token(token_ids[i])
        return token_ids

    def _sample_rows(self, logits, params, request_ids, rows: list[int]):
        import torch

        picked = [params[i] for i in rows]
        probs = filter_logits(
            logits[rows],  # (R, V)
            [p.temperature for p in picked], [p.top_k for p in picked], [p.top_p for p in picked],
        ).softmax(dim=-1)  # (R, V)
        draws = [
            torch.multinomial(probs[r], 1, generator=self.generator_for(request_ids[i], params[i].seed))
            for r, i in enumerate(rows)
        ]
        return torch.cat(draws)  # (R,)
