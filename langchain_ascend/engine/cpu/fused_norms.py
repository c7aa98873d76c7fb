"""RMSNorm of known decoder families through one fused op: same values, less per-call overhead.

Transformers' ``LlamaRMSNorm``-style modules run seven small ops per call, twice per layer plus
once at the end. Float32 modules instead run the native one-pass kernel (``native.rms_norm``)
for inputs of up to its row limit (decode steps), else ``torch.nn.functional.rms_norm``: equal
to transformers' result in float32 (tested; up to float rounding of the sum for the kernel).
Other dtypes keep transformers' rounding order (normalise in float32, round, then scale).
Only the module instances' ``forward`` is swapped (``engine.cpu.swap``).
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend.engine.cpu.swap import is_swapped, swap_forward
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

    return (type(module).__name__ in FUSABLE_NORMS and not is_swapped(module)
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
            swap_forward(module, _fused_forward, "fused_norms")
            count += 1
    if count:
        logger.info("fused %d RMSNorm modules", count)
    return count
