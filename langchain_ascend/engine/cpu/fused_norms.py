"""RMSNorm of known decoder families through torch's fused op: same values, less overhead.

Transformers' ``LlamaRMSNorm``-style modules run seven small ops per call (cast, square, mean,
add, rsqrt, multiply, scale). On CPU a decode step is partly bound by per-op overhead, and a
model calls its norm twice per layer plus once at the end (17 calls per bench-model step):
``torch.nn.functional.rms_norm`` does the same in one op, 51 us -> 22 us per call on the test
host. In float32 the two give bit-identical results (tested), so the swap is limited to
float32 modules; other dtypes keep transformers' rounding order (normalise in float32, round,
then scale).

Inside a decode step even that op cost 70-100 us per call (17 calls, 1.2-1.7 ms per step of
the bench model; it still runs several small ops), so inputs of up to ``MAX_ROWS`` rows go
to the native kernel where it is built (``native.rms_norm``: one pass, a few us, equal to
``F.rms_norm`` up to float rounding of the sum); larger inputs (prefills) keep torch's op.

Like ``weight_layout``, this swaps ``forward`` on module instances; the model code, its
parameters and its state dict are unchanged.
"""

from __future__ import annotations

import logging
import types
from typing import Any

from langchain_ascend.native import rms_norm as native_rms_norm

logger = logging.getLogger(__name__)

FUSABLE_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
"""Classes whose forward is exactly ``weight * x * rsqrt(mean(x^2) + eps)``."""


def _fused_forward(self: Any, hidden_states: Any) -> Any:
    import torch.nn.functional as F

    out = native_rms_norm.rms_norm(hidden_states, self.weight, self.variance_epsilon)
    if out is not None:
        return out
    return F.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)


def is_fusable(module: Any) -> bool:
    """Whether ``module`` is a float32 RMSNorm of a known family with its own forward."""
    import torch

    return (type(module).__name__ in FUSABLE_NORMS and "forward" not in module.__dict__
            and getattr(module, "weight", None) is not None
            and module.weight.dtype == torch.float32
            and isinstance(getattr(module, "variance_epsilon", None), float))


def fuse_rms_norms(model: Any) -> int:
    """Route every fusable RMSNorm of ``model`` through ``F.rms_norm``.

    Returns:
        How many modules were switched.
    """
    import torch.nn.functional as F

    if not hasattr(F, "rms_norm"):
        return 0
    count = 0
    for module in model.modules():
        if is_fusable(module):
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    if count:
        logger.info("fused %d RMSNorm modules", count)
    return count
