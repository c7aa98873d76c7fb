"""RMSNorm of known decoder families through one fused op: same values, less per-call overhead.

Transformers' ``LlamaRMSNorm``-style modules run seven small ops per call, twice per layer plus
once at the end. Float32 modules instead run the native one-pass kernel (``native.rms_norm``)
for inputs of any size (where it is built, else ``torch.nn.functional.rms_norm``): equal to
transformers' result in float32 up to float rounding of the sum (tested). Every row goes
through the kernel, prefills included, so a decoding row's norm is the native decode stack's
(the same kernel) whether its step ran in the stack or per op beside a prefill.
Bfloat16 modules run the native bf16 kernel (``native.rms_norm.rms_norm_bf16``) in
transformers' rounding order (normalise in float32, round to bf16, scale by the bf16 weight,
round again, with the sum of squares in torch's AVX2 order: equal bit for bit, tested), else
transformers' own forward. Other dtypes keep their forward.
Only the module instances' ``forward`` is swapped (``engine.cpu.swap``).
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import families
from langchain_ascend.engine.cpu.swap import is_swapped, swap_forward
from langchain_ascend.native import rms_norm as native_rms_norm

logger = logging.getLogger(__name__)

FUSABLE_NORMS = families.native_classes("RMSNorm")
"""Classes whose forward is exactly ``weight * x * rsqrt(mean(x^2) + eps)``."""


def _fused_forward(self: Any, hidden_states: Any) -> Any:
    import torch.nn.functional as F

    # Every row through the kernel, however many the call has: a decoding row then gets the
    # bits the native decode stack gives it (the same kernel) even when a prefill shares its
    # step, and the kernel beats torch's op at prefill sizes too (2048 x 576: ~5 vs ~60 ms).
    out = native_rms_norm.rms_norm(hidden_states, self.weight, self.variance_epsilon,
                                   max_rows=None)
    if out is not None:
        return out
    return F.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)


def _bf16_forward(self: Any, hidden_states: Any) -> Any:
    out = native_rms_norm.rms_norm_bf16(hidden_states, self.weight, self.variance_epsilon,
                                        max_rows=None)
    if out is not None:
        return out
    return type(self).forward(self, hidden_states)  # transformers' rounding order


def is_fusable(module: Any) -> bool:
    """Whether ``module`` is a float32 or (with the native kernel) bfloat16 RMSNorm of a known
    family with its own forward."""
    import torch

    if (type(module).__name__ not in FUSABLE_NORMS or is_swapped(module)
            or getattr(module, "weight", None) is None
            or not isinstance(getattr(module, "variance_epsilon", None), float)):
        return False
    dtype = module.weight.dtype
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_rms_norm.available())


def fuse_rms_norms(model: Any) -> list[Any]:
    """Route every fusable RMSNorm of ``model`` through the native kernel or ``F.rms_norm``
    (float32) or the native bf16 kernel (bfloat16).

    Returns:
        The modules switched.
    """
    import torch
    import torch.nn.functional as F

    if not hasattr(F, "rms_norm"):
        return []
    fused = [module for module in model.modules() if is_fusable(module)]
    for module in fused:
        forward = _bf16_forward if module.weight.dtype == torch.bfloat16 else _fused_forward
        swap_forward(module, forward, "fused_norms")
    if fused:
        logger.info("fused %d RMSNorm modules", len(fused))
    return fused
