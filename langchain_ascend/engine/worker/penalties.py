"""Repetition, presence and frequency penalties over a batch of logits rows (pure functions).

The two families read different token histories, as their origins define them:

* ``repetition_penalty`` (Hugging Face's ``RepetitionPenaltyLogitsProcessor``): every token
  present in the prompt or the reply so far has its logit divided by the penalty when it is
  positive and multiplied by it otherwise, whatever its count;
* ``presence_penalty`` / ``frequency_penalty`` (OpenAI's): over the reply only,
  ``logit -= presence * (count > 0) + frequency * count``.

All penalized rows of a step are done together: their histories are flattened into one
``(N,)`` index tensor, scattered into ``(R, V)`` masks and counts, and applied with a few
batched ops (no per-row torch op). The sampler calls :func:`apply_penalties` before any
choice, greedy rows included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_ascend.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


def _row_and_token_indices(histories: Sequence[Sequence[int]], device: torch.device,
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows (N,), tokens (N,))``: row ``r``'s index repeated once per token of its history."""
    import torch

    rows = [r for r, history in enumerate(histories) for _ in range(len(history))]
    tokens = [t for history in histories for t in history]
    return (torch.tensor(rows, dtype=torch.long, device=device),  # (N,)
            torch.tensor(tokens, dtype=torch.long, device=device))  # (N,)


def penalize(logits: torch.Tensor, *, repetition: Sequence[float], presence: Sequence[float],
             frequency: Sequence[float], context_ids: Sequence[Sequence[int]],
             output_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Apply the penalties to ``R`` logits rows (pure function).

    Args:
        logits: ``(R, V)`` float32 logits.
        repetition: ``R`` repetition penalties (1 = off).
        presence: ``R`` presence penalties (0 = off).
        frequency: ``R`` frequency penalties (0 = off).
        context_ids: Each row's prompt and reply tokens (the repetition penalty's history).
        output_ids: Each row's reply tokens (the presence and frequency penalties' history).

    Returns:
        ``(R, V)`` penalized logits (a new tensor).
    """
    import torch

    device = logits.device
    num_rows, vocab = logits.shape
    out = logits.clone()  # (R, V)
    if any(p != 1.0 for p in repetition):
        rows, tokens = _row_and_token_indices(context_ids, device)  # (N,), (N,)
        seen = torch.zeros((num_rows, vocab), dtype=torch.bool, device=device)  # (R, V)
        seen[rows, tokens] = True
        penalty = torch.tensor(repetition, dtype=out.dtype, device=device)[:, None]  # (R, 1)
        out = torch.where(seen, torch.where(out < 0, out * penalty, out / penalty), out)
    if any(p != 0.0 for p in presence) or any(f != 0.0 for f in frequency):
        rows, tokens = _row_and_token_indices(output_ids, device)  # (N,), (N,)
        counts = torch.zeros((num_rows, vocab), dtype=out.dtype, device=device)  # (R, V)
        counts.index_put_((rows, tokens), torch.ones_like(rows, dtype=out.dtype),
                          accumulate=True)
        pres = torch.tensor(presence, dtype=out.dtype, device=device)[:, None]  # (R, 1)
        freq = torch.tensor(frequency, dtype=out.dtype, device=device)[:, None]  # (R, 1)
        out = out - freq * counts - pres * (counts > 0).to(out.dtype)  # (R, V)
    return out


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None) -> None:
    """Penalize, in place, the rows of ``logits`` whose params carry a penalty.

    Args:
        logits: ``(S, V)`` float32 logits of the step's sampled rows.
        params: Each row's sampling parameters.
        histories: Each row's ``(prompt_ids, output_ids)``; needed when a row has a penalty.

    Raises:
        ValueError: A penalized row without its history.
    """
    import torch

    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return
    if histories is None or len(histories) != len(params):
        raise ValueError("rows with penalties need their (prompt_ids, output_ids) histories")
    picked = [params[i] for i in rows]
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)  # (R,)
    penalized = penalize(
        logits.index_select(0, index),  # (R, V)
        repetition=[p.repetition_penalty for p in picked],
        presence=[p.presence_penalty for p in picked],
        frequency=[p.frequency_penalty for p in picked],
        context_ids=[list(histories[i][0]) + list(histories[i][1]) for i in rows],
        output_ids=[histories[i][1] for i in rows])
    logits.index_copy_(0, index, penalized)
