"""Memory layout of the linear weights on CPU: a measured decode speed-up, same model.

A decode step on CPU is bound by streaming the weights through matrix-vector products. With
the float32 weights of ``nn.Linear`` stored as loaded (row-major ``(out, in)``), ``F.linear``
for a single row runs MKL's transposed mat-vec; storing the same values column-major (the
``(out, in)`` tensor is a transposed view of a contiguous ``(in, out)`` one) makes it a plain
streaming product. Measured on the 2-core AMD EPYC CPU with the ~40M ``bench`` model
(``benchmarks/bench_decode.py``, interleaved runs): single-request decode steps ~20% faster;
4-request steps and prefill within noise. bfloat16 weights are left alone (oneDNN is much
slower on column-major bf16 weights there).

Shapes, values and the model code are unchanged; a tied output head / input embedding shares
the new storage (embedding lookups read strided rows, a few ms per thousand tokens).
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import platform

logger = logging.getLogger(__name__)

LAYOUTS = ("auto", "row", "column")


def resolve_layout(layout: str, device: Any, dtype: Any) -> str:
    """``"row"`` or ``"column"`` for ``layout`` on ``device`` with weights of ``dtype``.

    ``"auto"`` means column-major for float32 weights on CPU, row-major (as loaded) otherwise.

    Raises:
        ValueError: ``layout`` is not one of :data:`LAYOUTS`.
    """
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"weight_layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    if platform.device_type(device) == "cpu" and dtype == torch.float32:
        return "column"
    return "row"


def apply_layout(model: Any, layout: str) -> int:
    """Store every ``nn.Linear`` weight of ``model`` in ``layout`` (``"row"``/``"column"``).

    Returns:
        How many weight tensors were re-laid out.
    """
    import torch

    changed = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            weight = module.weight
            is_column = weight.dim() == 2 and weight.stride() == (1, weight.shape[0])
            if layout == "column" and not is_column:
                weight.data = weight.data.t().contiguous().t()  # (out, in), column-major
                changed += 1
            elif layout == "row" and not weight.data.is_contiguous():
                weight.data = weight.data.contiguous()  # (out, in), row-major
                changed += 1
    if changed:
        logger.info("stored %d linear weights %s-major", changed, layout)
    return changed
