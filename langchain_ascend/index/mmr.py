"""Maximal marginal relevance on the device.

Same selection rule and tie-breaking as ``langchain_community``'s
``maximal_marginal_relevance``: cosine similarities (a zero vector has similarity 0), start
from the candidate most similar to the query, then repeatedly add the candidate maximising
``lambda * sim(query, c) - (1 - lambda) * max(sim(c, selected))``; ties go to the earlier
candidate. The loop keeps every index on the device; one host copy happens at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _unit_rows(matrix: torch.Tensor) -> torch.Tensor:
    norms = matrix.norm(dim=-1, keepdim=True)  # (n, 1)
    return matrix / norms.clamp_min(1e-30)


def mmr_select(query: torch.Tensor, candidates: torch.Tensor, k: int,
               lambda_mult: float = 0.5) -> list[int]:
    """Indices (into ``candidates``) chosen by MMR, in selection order.

    Args:
        query: (D,) query vector.
        candidates: (F, D) candidate vectors, best-first from the similarity search.
        k: How many to select (at most F).
        lambda_mult: 1 = pure relevance, 0 = pure diversity.
    """
    import torch

    count = min(k, candidates.shape[0])
    if count <= 0:
        return []
    cands = _unit_rows(candidates.float())  # (F, D)
    q = _unit_rows(query.float().reshape(1, -1))[0]  # (D,)
    to_query = cands @ q  # (F,)
    pairwise = cands @ cands.T  # (F, F)
    chosen = torch.empty(count, dtype=torch.int64, device=cands.device)
    taken = torch.zeros(cands.shape[0], dtype=torch.bool, device=cands.device)
    first = to_query.argmax()
    chosen[0] = first
    taken[first] = True
    redundancy = pairwise[first].clone()  # (F,) max similarity to the selected set
    for step in range(1, count):
        score = lambda_mult * to_query - (1.0 - lambda_mult) * redundancy  # (F,)
        score = score.masked_fill(taken, float("-inf"))
        best = score.argmax()
        chosen[step] = best
        taken[best] = True
        redundancy = torch.maximum(redundancy, pairwise[best])
    result: Any = chosen.tolist()
    return result
