"""A linear layer in the CPU's ``"dual"`` weight layout: our own ``nn.Linear`` subclass.

:class:`DualLinear` shares an ``nn.Linear``'s weight and bias parameters and holds, as its own
attributes, the copies its products read (``engine.cpu.weight_layout`` says which and why):
for float32 a one-row route (``single_row_mode``: the native mat-vec on the weight, on an
``(out/8, in, 8)`` tiles copy, or a batched product over the weight's halves), the tiles for
2 to ``native_max_rows`` rows and a oneDNN-packed copy for more; for bfloat16 a tiles copy for
the native bf16 kernel up to ``native_max_rows`` rows, ``F.linear`` beyond. Its ``forward``
picks the product by the number of input rows; results equal ``F.linear`` up to float rounding.
Under ``torch.compile`` (the compiled static decode step) it runs ``F.linear``: the native
kernels are ctypes calls the tracer cannot follow.

``weight_layout.apply_layout`` puts one in place of each ``nn.Linear`` of a model (a module of
ours in the tree, as ``quant.linear.QuantizedLinear`` is), and the owned CPU model holds the
fused ones (``engine.cpu.fused_projections``) directly.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from langchain_ascend.native import matvec

logger = logging.getLogger(__name__)

SMALL_BATCH_ROWS = 8
"""``"dual"`` computes float32 products of 2 to this many rows as ``W @ x^T``."""
PACKED_FOR_ROWS = 64
"""Row count the oneDNN weight copy is packed for (it serves any row count)."""
OUTPUT_HEAVY_RATIO = 4
"""``"dual"`` keeps a transposed copy for single rows of layers with ``out >= ratio * in``."""
BF16_TILES = "bf16_tiles"
"""``single_row_mode`` of a bf16 linear whose products go to the native bf16 kernel."""


class DualLinear(torch.nn.Linear):
    """``y = x W^T + b`` over an ``nn.Linear``'s parameters in the ``"dual"`` layout (module
    docstring).

    Args:
        weight: The ``(out, in)`` row-major weight parameter (shared, not copied).
        bias: The ``(out,)`` bias parameter, or None.
        native_max_rows: For a bf16 layer on the native kernel: the most rows it sends to the
            kernel (0: none, until ``weight_layout.tune_bf16_native_rows`` sets it). A float32
            layer starts at :data:`SMALL_BATCH_ROWS` where it has tiles (output-heavy), else
            0, until ``weight_layout.tune_f32_native_rows`` sets it.

    Attributes:
        single_row_mode: ``"rows"``, ``"tiles"``, ``"halves"`` (float32) or :data:`BF16_TILES`.
        single_row_weight, single_row_transposed: The one-row operand (float32).
        packed_weight: The oneDNN copy (float32), or None.
        f32_tiles, bf16_tiles: ``(out/8, in, 8)`` tiles copies, or None.
        native_max_rows: Most rows sent to the native rows kernel.
    """

    def __init__(self, weight: Any, bias: Any = None, native_max_rows: int = 0) -> None:
        torch.nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = bias
        self.single_row_mode = "halves"
        self.single_row_weight: Any = None
        self.single_row_transposed = False
        self.packed_weight: Any = None
        self.f32_tiles: Any = None
        self.bf16_tiles: Any = None
        self.native_max_rows = native_max_rows
        with torch.no_grad():
            data = weight.data
            if uses_bf16_kernel(data):
                self.single_row_mode = BF16_TILES
                if takes_bf16_tiles(data, bias):
                    self.bf16_tiles = matvec.pack_tiles(data)  # (out/8, in, 8)
                return
            if matvec.applies_to(data, bias):
                if output_heavy(data) and data.shape[0] % 8 == 0:
                    self.single_row_mode = "tiles"
                    self.single_row_weight = matvec.pack_tiles(data)  # (out/8, in, 8)
                else:
                    self.single_row_mode, self.single_row_weight = "rows", data
            if self.single_row_mode == "halves":
                self.single_row_weight, self.single_row_transposed = single_row_weight(data)
            self.packed_weight = packed_weight(data)
            if self.single_row_mode == "tiles":
                self.f32_tiles = self.single_row_weight
                self.native_max_rows = SMALL_BATCH_ROWS

    @classmethod
    def of(cls, linear: Any) -> DualLinear:
        """The ``"dual"`` layer over ``linear``'s own parameters."""
        return cls(linear.weight, linear.bias)

    def plain(self) -> Any:
        """An ``nn.Linear`` over the same parameters (the ``"row"`` layout again)."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=False,
                                 device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def forward(self, x: Any) -> Any:
        if torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        if self.single_row_mode == BF16_TILES:
            return _bf16_forward(self, x)
        return _f32_forward(self, x)


def output_heavy(weight: Any) -> bool:
    """Whether a weight has ``out >= OUTPUT_HEAVY_RATIO * in`` (its one-row product reads a
    tiles or transposed copy)."""
    out_features, in_features = weight.shape
    return bool(out_features >= OUTPUT_HEAVY_RATIO * in_features)


def single_row_weight(weight: Any) -> tuple[Any, bool]:
    """The weight as two halves for a one-row ``torch.bmm`` (pure function).

    Args:
        weight: A row-major ``(out, in)`` linear weight.

    Returns:
        ``(halves, transposed)``: ``(2, out/2, in)`` (a view of ``weight``) with
        ``transposed=False``, or for output-heavy weights a ``(2, in, out/2)`` contiguous copy
        with ``transposed=True``. A weight with an odd ``out`` comes back as one ``(1, out,
        in)`` view.
    """
    out_features, in_features = weight.shape
    if out_features % 2:
        return weight.view(1, out_features, in_features), False
    half = out_features // 2
    if output_heavy(weight):
        halves = weight.t().reshape(in_features, 2, half).permute(1, 0, 2).contiguous()
        return halves, True  # (2, in, out/2)
    return weight.view(2, half, in_features), False  # (2, out/2, in)


def packed_weight(weight: Any) -> Any:
    """The weight pre-packed for oneDNN's linear, or None where torch lacks the ops."""

    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
    except (AttributeError, RuntimeError) as exc:
        logger.debug("no oneDNN-packed weight: %s", exc)
        return None


def _f32_forward(self: Any, x: Any) -> Any:
    """``nn.Linear.forward`` of a float32 layer with the fastest product for the number of input rows.

    One row: the native mat-vec where it is built (``native.matvec``: on the row-major
    weight, or on its tiles copy for output-heavy layers), else a batched product over the
    weight's halves (see :func:`single_row_weight`). 2 to ``native_max_rows`` rows: the native
    kernel on the tiles copy where there is one (each tile read once for all rows). Other
    products: :func:`torch_rows_product`.
    """

    in_features = x.shape[-1]
    num_rows = x.numel() // in_features
    if num_rows == 1 and self.single_row_mode != "halves":
        row = x.reshape(in_features)
        if self.single_row_mode == "tiles":
            out = matvec.matvec_tiles(self.single_row_weight, row, self.bias)  # (out,)
        else:
            out = matvec.matvec(self.weight, row, self.bias)  # (out,)
        if out is None:  # not expected: the kernel was checked when the layout was made
            return F.linear(x, self.weight, self.bias)
        return out.view(*x.shape[:-1], -1)  # (..., out)
    if num_rows == 1:
        halves = self.single_row_weight
        row = x.reshape(1, in_features)
        if self.single_row_transposed:
            out = torch.bmm(row.expand(halves.shape[0], 1, in_features), halves)  # (P, 1, out/P)
        else:
            out = torch.bmm(halves, row.t().expand(halves.shape[0], in_features, 1))  # (P,out/P,1)
        out = out.view(*x.shape[:-1], -1)  # (..., out)
        return out if self.bias is None else out.add_(self.bias)
    rows = x.reshape(num_rows, in_features)  # (M, in)
    out = None
    if self.f32_tiles is not None and num_rows <= self.native_max_rows:
        out = matvec.matvec_tiles_rows(self.f32_tiles, rows, self.bias)  # (M, out)
    if out is None:
        out = torch_rows_product(self, rows)  # (M, out)
    return out.view(*x.shape[:-1], out.shape[-1])  # (..., out)


def torch_rows_product(linear: Any, rows: Any) -> Any:
    """``rows (M, in) @ W^T [+ bias]`` -> ``(M, out)`` in torch for a float32 ``"dual"`` layer:
    up to :data:`SMALL_BATCH_ROWS` rows as ``W @ x^T`` on the row-major weight (MKL's small-M
    path of ``x @ W^T`` is far slower here), more through oneDNN on the packed copy."""

    if rows.shape[0] > SMALL_BATCH_ROWS:
        if linear.packed_weight is None:
            return F.linear(rows, linear.weight, linear.bias)
        return torch.ops.mkldnn._linear_pointwise(rows, linear.packed_weight, linear.bias,
                                                  "none", [], "")
    if linear.bias is None:
        out_t = torch.mm(linear.weight, rows.t())  # (out, M)
    else:
        out_t = torch.addmm(linear.bias[:, None], linear.weight, rows.t())  # (out, M)
    return out_t.t().contiguous()  # (M, out)


def _bf16_forward(self: Any, x: Any) -> Any:
    """``nn.Linear.forward`` of a bf16 linear: up to ``native_max_rows`` rows through the
    native bf16 kernel on the tiles copy, anything else (more rows, another input dtype, a
    layer without tiles) through ``F.linear``."""

    in_features = x.shape[-1]
    num_rows = x.numel() // in_features if in_features else 0
    if self.bf16_tiles is not None and 0 < num_rows <= self.native_max_rows:
        rows = x.reshape(num_rows, in_features)  # (M, in)
        out = matvec.matvec_tiles_rows_bf16(self.bf16_tiles, rows, self.bias)  # (M, out)
        if out is not None:
            return out.view(*x.shape[:-1], out.shape[-1])  # (..., out)
    return F.linear(x, self.weight, self.bias)


def uses_bf16_kernel(weight: Any) -> bool:
    """Whether ``"dual"`` lays out this weight for the native bf16 kernel: bfloat16 on CPU,
    2-D, with the kernel built here (layers it cannot take then run ``F.linear``)."""

    return (weight.dim() == 2 and weight.dtype == torch.bfloat16
            and weight.device.type == "cpu" and matvec.bf16_available())


def takes_bf16_tiles(weight: Any, bias: Any) -> bool:
    """Whether a linear layer can use the native bf16 kernel (:func:`uses_bf16_kernel`, and
    ``out % 8 == 0``, ``in > 0``, a contiguous bf16 bias or none)."""

    return (uses_bf16_kernel(weight) and weight.shape[0] % 8 == 0 and weight.shape[1] > 0
            and (bias is None or (bias.dtype == torch.bfloat16 and bias.is_contiguous())))


def takes_f32_tiles(weight: Any, bias: Any) -> bool:
    """Whether a float32 linear layer can use the native rows kernel on a tiles copy
    (``matvec.applies_to`` it, and ``out % 8 == 0``)."""
    return matvec.applies_to(weight, bias) and weight.shape[0] % 8 == 0
