"""Memory layout of the linear weights on CPU: a measured decode speed-up, same model.

A decode step on CPU is bound by streaming the weights through matrix products, and which
MKL path a product takes matters more than its size on the 2-core AMD EPYC test host
(float32, 2 threads, quiet machine):

* one input row (a single decode, the LM head of one sampled position): the same values
  stored column-major (the ``(out, in)`` tensor a transposed view of a contiguous
  ``(in, out)`` one) — whole bench-model decode step 30.3 ms -> 24.2 ms;
* 2 to 128 rows (batched decodes, short prefill chunks): ``W @ x^T`` on the row-major weight
  instead of ``x @ W^T`` — all bench-model weights at 4 rows 52 ms -> 22 ms, at 16 rows
  65 ms -> 46 ms; a batch-4 decode step 31.6 ms vs 55.1 ms for transformers' own step;
* more rows (long prefills): ``F.linear`` as usual.

Layouts:

* ``"row"``: as loaded.
* ``"column"``: every linear weight re-stored column-major (no extra memory).
* ``"dual"``: weights stay row-major, each linear layer also keeps a column-major copy, and
  its ``forward`` picks the product by row count as above (twice the linear-weight memory).
* ``"auto"``: ``"dual"`` for float32 weights on CPU when the copies fit in a quarter of the
  available RAM, else ``"row"``; ``"row"`` elsewhere (accelerators, bf16/fp16: oneDNN is far
  slower on column-major bf16 weights).

Values, shapes, parameters and the model code are unchanged; ``"dual"`` only swaps the
``forward`` of each ``nn.Linear`` instance (results equal ``F.linear`` up to float rounding).
"""

from __future__ import annotations

import logging
import types
from typing import Any

from langchain_ascend import platform

logger = logging.getLogger(__name__)

LAYOUTS = ("auto", "row", "column", "dual")
DUAL_MAX_RAM_SHARE = 0.25
"""``"auto"`` picks ``"dual"`` only while the copies take at most this share of free RAM."""
SMALL_BATCH_ROWS = 128
"""``"dual"`` computes products of 2 to this many rows as ``W @ x^T``."""


def _linears(model: Any) -> list[Any]:
    import torch

    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def resolve_layout(layout: str, model: Any) -> str:
    """The concrete layout (``"row"``, ``"column"`` or ``"dual"``) for ``model``.

    Raises:
        ValueError: ``layout`` is not one of :data:`LAYOUTS`.
    """
    import torch

    if layout not in LAYOUTS:
        raise ValueError(f"weight_layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    first = next(model.parameters())
    if platform.device_type(first.device) != "cpu" or first.dtype != torch.float32:
        return "row"
    copy_bytes = sum(m.weight.numel() * m.weight.element_size() for m in _linears(model))
    free = platform.memory_info(first.device).free
    return "dual" if copy_bytes <= DUAL_MAX_RAM_SHARE * free else "row"


def _small_batch_forward(self: Any, x: Any) -> Any:
    """``nn.Linear.forward`` with the fastest product for few input rows.

    One row: the column-major copy. Up to :data:`SMALL_BATCH_ROWS` rows: ``W @ x^T`` on the
    row-major weight (MKL's small-M path of ``x @ W^T`` is far slower here). More rows: as usual.
    """
    import torch
    import torch.nn.functional as F

    num_rows = x.numel() // x.shape[-1]
    if num_rows == 1:
        return F.linear(x, self.weight_column_major, self.bias)
    if num_rows > SMALL_BATCH_ROWS:
        return F.linear(x, self.weight, self.bias)
    rows = x.reshape(num_rows, x.shape[-1])  # (M, in)
    if self.bias is None:
        out_t = torch.mm(self.weight, rows.t())  # (out, M)
    else:
        out_t = torch.addmm(self.bias[:, None], self.weight, rows.t())  # (out, M)
    return out_t.t().contiguous().view(*x.shape[:-1], out_t.shape[0])  # (..., out)


def current_layout(module: Any) -> str:
    """The layout one ``nn.Linear`` is in now."""
    if "weight_column_major" in module.__dict__:
        return "dual"
    weight = module.weight
    return "column" if weight.dim() == 2 and weight.stride() == (1, weight.shape[0]) else "row"


def apply_layout(model: Any, layout: str) -> int:
    """Lay out every ``nn.Linear`` of ``model`` as ``"row"``, ``"column"`` or ``"dual"``.

    Returns:
        How many linear layers changed layout.
    """
    import torch

    changed = 0
    with torch.no_grad():
        for module in _linears(model):
            before = current_layout(module)
            if before == layout:
                continue
            if before == "dual":
                del module.weight_column_major
                del module.forward  # back to nn.Linear.forward
            elif before == "column":
                module.weight.data = module.weight.data.contiguous()  # (out, in), row-major
            if layout == "column":
                module.weight.data = module.weight.data.t().contiguous().t()  # column-major
            elif layout == "dual":
                module.weight_column_major = module.weight.data.t().contiguous().t()
                module.forward = types.MethodType(_small_batch_forward, module)
            changed += 1
    if changed:
        logger.info("laid out %d linear layers as %r", changed, layout)
    return changed
