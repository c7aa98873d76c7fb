"""Greedy choice over a half-precision screen of the LM head: the float32 argmax, half the bytes.

A CPU decode step is bound by streaming weights, and the output head is often the largest of
them (40% of the bench model's bytes per step). A greedy row needs only the argmax of its
logits, so :class:`ScreenedGreedyHead`

1. computes approximate logits from a float16 copy of the head (``native.matvec``: 33.5 MB,
   accumulated in float32),
2. bounds their error (below), keeps the candidates whose approximate logit is within twice
   the bound of the best one (usually one to a few tokens), and
3. recomputes those candidates' logits in float32 and returns the argmax (lowest id on ties,
   like ``torch.argmax``) -- steps 1-3 in one native call.

The full float32 argmax is always among the candidates, so the choice is the float32 greedy
choice (up to float32 rounding, as between any two float32 kernels).

Error bound for the hidden row ``h`` (length ``K``) and the head row ``w_j``: float16 rounding
moves each weight by at most ``2^-11 |w|`` (normal range) or ``2^-25`` (subnormals), and a
float32 dot product of ``K`` terms is off by at most ``gamma_K sum |h_i w_i|`` with
``gamma_K = K 2^-24 / (1 - K 2^-24)``, for the approximate and the exact product alike. With
Cauchy-Schwarz:

    |approx_j - exact_j| <= ||h|| ((2^-11 + 2 gamma_K) max_j ||w_j|| + 2^-25 sqrt(K))

Applies only where the head is exactly "hidden state times ``lm_head.weight``" (the model
types of ``families.PLAIN_HEAD_MODEL_TYPES``: no bias, no logit scaling or soft-capping), in
float32 on CPU with the native kernels built. It is the runner's logits-head strategy
(:meth:`ScreenedGreedyHead.run`): a step whose one sampled row is plain greedy takes its token
from the screen, every other step the model's own head. Figures in ``docs/performance.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_ascend import families, platform
from langchain_ascend.native import matvec

if TYPE_CHECKING:
    import torch

    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.hook_types import PackedStep

logger = logging.getLogger(__name__)

SAFETY = 1.01
"""Headroom on the error bound's constant."""
MAX_RAM_SHARE = 0.1
"""The float16 copy is made only while it takes at most this share of free RAM."""


def error_bound_scale(weight: torch.Tensor) -> float:
    """``c`` such that ``|approx_j - exact_j| <= c * ||h||`` for every row ``j`` of ``weight``
    (see the module docstring; pure function)."""
    size = weight.shape[1]
    unit32 = 2.0 ** -24
    gamma = size * unit32 / (1 - size * unit32)
    max_row_norm = float(weight.double().norm(dim=1).max())
    return SAFETY * ((2.0 ** -11 + 2 * gamma) * max_row_norm + 2.0 ** -25 * math.sqrt(size))


class ScreenedGreedyHead:
    """The float32 greedy token of a hidden row, screened through a float16 copy of the head.

    Args:
        weight: ``(V, K)`` float32 output-head weight (kept by reference, not copied).

    Raises:
        ValueError: ``V`` is not a multiple of 8 or a weight exceeds float16's range.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        import torch

        self.weight = weight
        self.tiles = matvec.pack_tiles_f16(weight)  # (V/8, K, 8) float16
        self.bound_scale = error_bound_scale(weight)
        self.scratch = torch.empty(weight.shape[0], dtype=torch.float32)  # screened logits
        self.last_candidates = 0
        """Tokens rescored in float32 by the last :meth:`choose`."""

    @classmethod
    def for_model(cls, model: Any) -> ScreenedGreedyHead | None:
        """The screened head of ``model``, or None where it does not apply (module docstring)."""
        import torch

        head = model.get_output_embeddings()
        config = model.config
        weight = getattr(head, "weight", None)
        if (getattr(config, "model_type", None) not in families.PLAIN_HEAD_MODEL_TYPES
                or not isinstance(head, torch.nn.Linear) or head.bias is not None
                or weight is None or weight.dtype != torch.float32
                or weight.device.type != "cpu" or weight.shape[0] % 8
                or not matvec.applies_to(weight, None)):
            return None
        copy_bytes = weight.numel() * 2
        if copy_bytes > MAX_RAM_SHARE * platform.memory_info(weight.device).free:
            logger.info("no screened greedy head: its %d MB copy would not leave enough RAM",
                        copy_bytes >> 20)
            return None
        try:
            screened = cls(weight.data)
        except ValueError as exc:
            logger.info("no screened greedy head: %s", exc)
            return None
        if screened.approximate_logits(torch.zeros(weight.shape[1])) is None:
            return None  # the float16 kernel is missing from this build
        return screened

    def approximate_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``(V,)`` logits of one ``(K,)`` hidden row from the float16 copy, or None."""
        return matvec.matvec_tiles_f16(self.tiles, hidden)

    def choose(self, hidden: torch.Tensor) -> int | None:
        """The greedy token of one ``(K,)`` float32 hidden row (one native call), or None
        where the kernel is missing or the screened logits are not finite."""
        result = matvec.greedy_screened_f16(self.tiles, self.weight, hidden, self.scratch,
                                            self.bound_scale)
        if result is None:
            return None
        token, self.last_candidates = result
        return token

    def run(self, runner: Any, packed: PackedStep, params: Sequence[SamplingParams],
            ) -> tuple[list[int] | None, torch.Tensor | None]:
        """The logits-head strategy (``engine.hook_types.LogitsHead``): one plain greedy row
        (no grammar, no penalty) of an eager step is screened; a declined screen and every
        other step get the model's own head."""
        if not (len(params) == 1 and params[0].greedy and params[0].constraint is None
                and not params[0].has_penalties
                and not runner.compiler.enabled):
            return None, runner.compute_logits(*packed)  # (S, V)
        hidden = runner.compute_hidden(*packed)  # (1, hidden)
        token = self.choose(hidden[0])
        if token is not None:
            return [token], None
        return None, runner.model.get_output_embeddings()(hidden)  # (1, V)
