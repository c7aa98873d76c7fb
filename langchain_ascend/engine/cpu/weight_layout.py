"""Memory layout of the linear weights for the CPU decode step: same model, faster products.

A CPU decode step streams every weight through a matrix product, and which kernel a product
takes matters more than its size: MKL's one-row mat-vec runs on one thread, its small-M path is
slow, and a weight pre-packed for oneDNN is faster for larger batches. So the ``"dual"`` layout
keeps the weights row-major and picks each ``nn.Linear``'s product by its number of input rows
(measurements in ``docs/performance.md``).

Layouts:

* ``"row"``: as loaded.
* ``"column"``: every linear weight re-stored column-major (no extra memory).
* ``"dual"``: row-major weights; one row goes to the native mat-vec (``native.matvec``, on the
  weight itself, or on an ``(out/8, in, 8)`` tiles copy for output-heavy layers,
  ``out >= 4 * in``) or, without the native kernels, to a batched product over the weight's
  two halves (a transposed copy for output-heavy layers); 2 to ``native_max_rows`` rows to the
  native kernel on an ``(out/8, in, 8)`` tiles copy (``native.matvec.matvec_tiles_rows``, any
  row count); other products of up to :data:`SMALL_BATCH_ROWS` rows to ``W @ x^T``; more rows
  to oneDNN on a pre-packed copy. Output-heavy layers have their tiles copy from the start
  (``native_max_rows`` at least :data:`SMALL_BATCH_ROWS`); :func:`tune_f32_native_rows`
  measures, on one representative layer, the largest of :data:`F32_PROBE_ROWS` at which the
  kernel beats that torch product and, where it wins at 2 rows or more, gives every layer with
  ``out % 8 == 0`` a tiles copy and that limit. Extra memory: about the linear weights twice
  more (the oneDNN copy and the tiles), plus the transposed copies without the native kernel.

  For bfloat16 weights where the native bf16 kernel is built, ``"dual"`` instead keeps one
  ``(out/8, in, 8)`` bf16 tiles copy per linear (``out % 8 == 0``; the weight itself stays
  as it is) and sends products of up to ``native_max_rows`` rows to
  ``native.matvec.matvec_tiles_rows_bf16`` (float32 sums, one rounding, like torch's bf16
  linear; a row's result does not depend on the other rows), more rows to ``F.linear``.
  ``native_max_rows`` is 0 (torch only) until :func:`tune_bf16_native_rows` measures, on one
  representative layer, the largest of :data:`BF16_PROBE_ROWS` at which the kernel beats
  ``F.linear`` on this machine (torch's bf16 products are slow on CPUs without native bf16
  math, and may win on CPUs with AVX-512-BF16 or AMX). Extra memory: the linear weights once
  more. Without the kernel, bf16 ``"dual"`` is the float32 scheme above, in torch.
* ``"auto"``: ``"dual"`` for float32 weights on CPU, and for bfloat16 weights on CPU where the
  native bf16 kernel is built, when the copies fit in :data:`DUAL_MAX_RAM_SHARE` of the free
  RAM, else ``"row"``; ``"row"`` elsewhere (oneDNN is far slower on column-major bf16
  weights).

Values, shapes, parameters and the model code are unchanged; ``"dual"`` only swaps the
``forward`` of each ``nn.Linear`` instance (``engine.cpu.swap``; results equal ``F.linear`` up
to float rounding).

Quantized linears (``quant.linear.QuantizedLinear``, weights kept as GGUF blocks) take no
float layout; whatever the layout, :func:`apply_layout` has ``engine.cpu.quantized_layout``
re-lay their blocks for the native product.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_ascend import platform
from langchain_ascend.engine.cpu.quantized_layout import pack_quantized_linears
from langchain_ascend.engine.cpu.swap import restore_forward, swap_forward, swapped_by
from langchain_ascend.engine.worker.hook_types import WEIGHT_LAYOUTS
from langchain_ascend.native import matvec

logger = logging.getLogger(__name__)

LAYOUTS = WEIGHT_LAYOUTS
DUAL = "weight_layout.dual"
"""The swap marker of a linear layer in the ``"dual"`` layout."""
DUAL_MAX_RAM_SHARE = 0.25
"""``"auto"`` picks ``"dual"`` only while the copies take at most this share of free RAM."""
SMALL_BATCH_ROWS = 8
"""``"dual"`` computes products of 2 to this many rows as ``W @ x^T``."""
PACKED_FOR_ROWS = 64
"""Row count the oneDNN weight copy is packed for (it serves any row count)."""
OUTPUT_HEAVY_RATIO = 4
"""``"dual"`` keeps a transposed copy for single rows of layers with ``out >= ratio * in``."""
BF16_TILES = "bf16_tiles"
"""``single_row_mode`` of a bf16 linear whose products go to the native bf16 kernel."""
BF16_PROBE_ROWS = (1, 16, 64, 256)
"""Row counts :func:`tune_bf16_native_rows` times, ascending (it stops at the first loss)."""
F32_PROBE_ROWS = (2, 8, 16, 32, 64)
"""Row counts :func:`tune_f32_native_rows` times, ascending (it stops at the first loss)."""
BF16_PROBE_REPEATS = 3
"""Timed runs of each product per probe after one warm-up run; the fastest counts."""
DUAL_ATTRIBUTES = ("single_row_mode", "single_row_weight", "single_row_transposed",
                   "packed_weight", "f32_tiles", "bf16_tiles", "native_max_rows")
"""Instance attributes ``make_dual`` may set (removed when the layout changes again)."""


def _linears(model: Any) -> list[Any]:
    """The model's ``nn.Linear`` layers, except those another preparation swapped (members of
    a fused group: their product is the group's, see ``engine.cpu.fused_projections``)."""
    import torch

    return [m for m in model.modules()
            if isinstance(m, torch.nn.Linear) and swapped_by(m) in (None, DUAL)]


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
    if platform.device_type(first.device) != "cpu":
        return "row"
    if first.dtype == torch.float32:  # the oneDNN copy, and the tiles or a transposed copy
        copy_bytes = sum(m.weight.numel() * m.weight.element_size()
                         * (2 if _output_heavy(m.weight) or m.out_features % 8 == 0 else 1)
                         for m in _linears(model))
    elif first.dtype == torch.bfloat16 and matvec.bf16_available():
        copy_bytes = sum(m.weight.numel() * m.weight.element_size() for m in _linears(model))
    else:
        return "row"
    free = platform.memory_info(first.device).free
    return "dual" if copy_bytes <= DUAL_MAX_RAM_SHARE * free else "row"


def _output_heavy(weight: Any) -> bool:
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
    if _output_heavy(weight):
        halves = weight.t().reshape(in_features, 2, half).permute(1, 0, 2).contiguous()
        return halves, True  # (2, in, out/2)
    return weight.view(2, half, in_features), False  # (2, out/2, in)


def packed_weight(weight: Any) -> Any:
    """The weight pre-packed for oneDNN's linear, or None where torch lacks the ops."""
    import torch

    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
    except (AttributeError, RuntimeError) as exc:
        logger.debug("no oneDNN-packed weight: %s", exc)
        return None


def _small_batch_forward(self: Any, x: Any) -> Any:
    """``nn.Linear.forward`` with the fastest product for the number of input rows.

    One row: the native mat-vec where it is built (``native.matvec``: on the row-major
    weight, or on its tiles copy for output-heavy layers), else a batched product over the
    weight's halves (see :func:`single_row_weight`). 2 to ``native_max_rows`` rows: the native
    kernel on the tiles copy where there is one (each tile read once for all rows). Other
    products: :func:`_torch_rows_product`.
    """
    import torch
    import torch.nn.functional as F

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
        out = _torch_rows_product(self, rows)  # (M, out)
    return out.view(*x.shape[:-1], out.shape[-1])  # (..., out)


def _torch_rows_product(linear: Any, rows: Any) -> Any:
    """``rows (M, in) @ W^T [+ bias]`` -> ``(M, out)`` in torch for a float32 ``"dual"`` layer:
    up to :data:`SMALL_BATCH_ROWS` rows as ``W @ x^T`` on the row-major weight (MKL's small-M
    path of ``x @ W^T`` is far slower here), more through oneDNN on the packed copy."""
    import torch
    import torch.nn.functional as F

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


def _bf16_tiles_forward(self: Any, x: Any) -> Any:
    """``nn.Linear.forward`` of a bf16 linear: up to ``native_max_rows`` rows through the
    native bf16 kernel on the tiles copy, anything else (more rows, another input dtype, a
    layer without tiles) through ``F.linear``."""
    import torch.nn.functional as F

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
    import torch

    return (weight.dim() == 2 and weight.dtype == torch.bfloat16
            and weight.device.type == "cpu" and matvec.bf16_available())


def takes_bf16_tiles(weight: Any, bias: Any) -> bool:
    """Whether a linear layer can use the native bf16 kernel (:func:`uses_bf16_kernel`, and
    ``out % 8 == 0``, ``in > 0``, a contiguous bf16 bias or none)."""
    import torch

    return (uses_bf16_kernel(weight) and weight.shape[0] % 8 == 0 and weight.shape[1] > 0
            and (bias is None or (bias.dtype == torch.bfloat16 and bias.is_contiguous())))


def takes_f32_tiles(weight: Any, bias: Any) -> bool:
    """Whether a float32 linear layer can use the native rows kernel on a tiles copy
    (``matvec.applies_to`` it, and ``out % 8 == 0``)."""
    return matvec.applies_to(weight, bias) and weight.shape[0] % 8 == 0


def current_layout(module: Any) -> str:
    """The layout one ``nn.Linear`` is in now."""
    if swapped_by(module) == DUAL:
        return "dual"
    weight = module.weight
    return "column" if weight.dim() == 2 and weight.stride() == (1, weight.shape[0]) else "row"


def make_dual(module: Any, native_max_rows: int = 0) -> None:
    """Give one row-major ``nn.Linear`` the ``"dual"`` layout (its copies and ``forward``).

    Args:
        module: The linear layer.
        native_max_rows: For a bf16 layer on the native kernel: the most rows it sends to
            the kernel (0: none, until :func:`tune_bf16_native_rows` sets it). A float32
            layer starts at :data:`SMALL_BATCH_ROWS` where it has tiles (output-heavy), else
            0, until :func:`tune_f32_native_rows` sets it.
    """
    import torch

    with torch.no_grad():
        weight = module.weight.data
        if uses_bf16_kernel(weight):
            tiles = matvec.pack_tiles(weight) if takes_bf16_tiles(weight, module.bias) else None
            module.single_row_mode = BF16_TILES
            module.bf16_tiles = tiles  # (out/8, in, 8), or None: F.linear only
            module.native_max_rows = native_max_rows
            swap_forward(module, _bf16_tiles_forward, DUAL)
            return
        mode, single, transposed = "halves", None, False
        if matvec.applies_to(weight, module.bias):
            if _output_heavy(weight) and weight.shape[0] % 8 == 0:
                mode, single = "tiles", matvec.pack_tiles(weight)  # (out/8, in, 8)
            else:
                mode, single = "rows", weight  # the weight itself
        if mode == "halves":
            single, transposed = single_row_weight(weight)
        module.single_row_mode, module.single_row_weight = mode, single
        module.single_row_transposed = transposed
        module.packed_weight = packed_weight(weight)
        module.f32_tiles = single if mode == "tiles" else None  # (out/8, in, 8), or None
        module.native_max_rows = SMALL_BATCH_ROWS if mode == "tiles" else 0
    swap_forward(module, _small_batch_forward, DUAL)


def apply_layout(model: Any, layout: str) -> int:
    """Lay out every ``nn.Linear`` of ``model`` as ``"row"``, ``"column"`` or ``"dual"``, and
    re-lay every quantized linear (``quantized_layout.pack_quantized_linears``, any layout).

    Returns:
        How many linear layers changed layout.
    """
    import torch

    changed = pack_quantized_linears(model)
    with torch.no_grad():
        for module in _linears(model):
            before = current_layout(module)
            if before == layout:
                continue
            if before == "dual":
                for name in DUAL_ATTRIBUTES:
                    module.__dict__.pop(name, None)
                restore_forward(module)  # back to nn.Linear.forward
            elif before == "column":
                module.weight.data = module.weight.data.contiguous()  # (out, in), row-major
            if layout == "column":
                module.weight.data = module.weight.data.t().contiguous().t()  # column-major
            elif layout == "dual":
                make_dual(module)
            changed += 1
    if changed:
        logger.info("laid out %d linear layers as %r", changed, layout)
    return changed


def dual_linears(model: Any) -> list[Any]:
    """The ``"dual"`` linears of ``model``, including fused projection groups' (held by their
    members' swap marker, not registered as modules), each once."""
    found: dict[int, Any] = {}
    for module in model.modules():
        owner = swapped_by(module)
        linear = module if owner == DUAL else getattr(owner, "linear", None)
        if linear is not None and swapped_by(linear) == DUAL:
            found.setdefault(id(linear), linear)
    return list(found.values())


def bf16_tiled_linears(model: Any) -> list[Any]:
    """The ``"dual"`` linears of ``model`` on the native bf16 kernel (:func:`dual_linears`)."""
    return [m for m in dual_linears(model)
            if m.single_row_mode == BF16_TILES and m.bf16_tiles is not None]


def f32_tileable_linears(model: Any) -> list[Any]:
    """The float32 ``"dual"`` linears of ``model`` the native rows kernel can take
    (:func:`takes_f32_tiles`)."""
    return [m for m in dual_linears(model)
            if m.single_row_mode != BF16_TILES and takes_f32_tiles(m.weight, m.bias)]


def best_times_s(first: Callable[[], Any], second: Callable[[], Any],
                 repeats: int = BF16_PROBE_REPEATS) -> tuple[float, float]:
    """The fastest of ``repeats`` timed calls of each function, in seconds, after one warm-up
    call of each; the two alternate, so a burst of load on the host slows both alike."""
    first()
    second()
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for index, fn in enumerate((first, second)):
            start = time.perf_counter()
            fn()
            best[index] = min(best[index], time.perf_counter() - start)
    return best[0], best[1]


def largest_winning_rows(native: Callable[[Any], Any], reference: Callable[[Any], Any],
                         in_features: int, dtype: Any, probe_rows: Sequence[int]) -> int:
    """The largest of ``probe_rows`` (ascending) up to which ``native(rows)`` is faster than
    ``reference(rows)`` on random ``(M, in_features)`` rows of ``dtype`` (timed by
    :func:`best_times_s`), stopping at the first loss; 0 when it loses at the first."""
    import torch

    generator = torch.Generator().manual_seed(0)
    best = 0
    with torch.no_grad():
        for num_rows in probe_rows:
            rows = torch.randn(num_rows, in_features, generator=generator,
                               dtype=torch.float32).to(dtype)  # (M, in)
            native_s, reference_s = best_times_s(lambda rows=rows: native(rows),
                                                 lambda rows=rows: reference(rows))
            if native_s >= reference_s:
                break
            best = num_rows
    return best


def measure_native_max_rows(linear: Any, probe_rows: Sequence[int] | None = None) -> int:
    """The largest of ``probe_rows`` up to which the native kernel beats torch on ``linear``
    (:func:`largest_winning_rows`): for a bf16 ``"dual"`` layer the bf16 kernel against
    ``F.linear`` (default probes :data:`BF16_PROBE_ROWS`); for a float32 one the rows kernel
    on a tiles copy (its own, or a temporary one) against :func:`_torch_rows_product`
    (default probes :data:`F32_PROBE_ROWS`)."""
    import torch
    import torch.nn.functional as F

    if linear.single_row_mode == BF16_TILES:
        return largest_winning_rows(
            lambda rows: matvec.matvec_tiles_rows_bf16(linear.bf16_tiles, rows, linear.bias),
            lambda rows: F.linear(rows, linear.weight, linear.bias), linear.in_features,
            torch.bfloat16, BF16_PROBE_ROWS if probe_rows is None else probe_rows)
    tiles = linear.f32_tiles
    if tiles is None:
        tiles = matvec.pack_tiles(linear.weight.detach())  # (out/8, in, 8)
    return largest_winning_rows(
        lambda rows: matvec.matvec_tiles_rows(tiles, rows, linear.bias),
        lambda rows: _torch_rows_product(linear, rows), linear.in_features, torch.float32,
        F32_PROBE_ROWS if probe_rows is None else probe_rows)


def representative_linear(linears: Sequence[Any]) -> Any:
    """The layer of median weight size among ``linears`` (decoder layers outnumber the head)."""
    ordered = sorted(linears, key=lambda m: m.weight.numel())
    return ordered[len(ordered) // 2]


def _measure_on_representative(linears: Sequence[Any], kind: str) -> int:
    """:func:`measure_native_max_rows` on :func:`representative_linear`, logged."""
    layer = representative_linear(linears)
    start = time.perf_counter()
    limit = measure_native_max_rows(layer)
    logger.info("%s products of up to %d rows go to the native kernel (measured on a (%d, %d) "
                "layer in %.0f ms)", kind, limit, layer.out_features, layer.in_features,
                1e3 * (time.perf_counter() - start))
    return limit


def tune_bf16_native_rows(model: Any) -> int | None:
    """Measure where the native bf16 kernel wins (:func:`measure_native_max_rows` on
    :func:`representative_linear`) and set that as ``native_max_rows`` of every bf16
    ``"dual"`` layer of ``model``.

    Returns:
        The row limit chosen, or None when no layer is on the native bf16 kernel.
    """
    linears = bf16_tiled_linears(model)
    if not linears:
        return None
    limit = _measure_on_representative(linears, "bf16")
    for linear in linears:
        linear.native_max_rows = limit
    return limit


def set_f32_native_rows(linear: Any, limit: int) -> None:
    """Route 2 to ``limit`` rows of a float32 ``"dual"`` layer to the native rows kernel: pack
    its tiles copy where ``limit >= 2`` and it has none; below that, drop the copy of a layer
    that does not use it for single rows. Output-heavy layers (tiles for single rows) keep at
    least :data:`SMALL_BATCH_ROWS`."""
    import torch

    single_row_tiles = linear.single_row_mode == "tiles"
    if limit >= 2 and linear.f32_tiles is None:
        with torch.no_grad():
            linear.f32_tiles = matvec.pack_tiles(linear.weight.data)  # (out/8, in, 8)
    elif limit < 2 and not single_row_tiles:
        linear.f32_tiles = None
    linear.native_max_rows = max(limit, SMALL_BATCH_ROWS if single_row_tiles else 0)


def tune_f32_native_rows(model: Any) -> int | None:
    """Measure up to how many rows the native float32 rows kernel beats torch
    (:func:`measure_native_max_rows` on :func:`representative_linear`) and apply that limit
    to every float32 ``"dual"`` layer the kernel can take (:func:`set_f32_native_rows`).

    Returns:
        The row limit measured, or None when no layer can take the kernel.
    """
    linears = f32_tileable_linears(model)
    if not linears:
        return None
    limit = _measure_on_representative(linears, "float32")
    for linear in linears:
        set_f32_native_rows(linear, limit)
    return limit
