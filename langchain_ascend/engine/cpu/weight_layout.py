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

Values, shapes, parameters and the model code are unchanged; ``"dual"`` puts a
:class:`~langchain_ascend.engine.cpu.dual_linear.DualLinear` (our ``nn.Linear`` subclass over
the same parameters, which holds the copies and picks the product) in place of each
``nn.Linear``; results equal ``F.linear`` up to float rounding.

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
from langchain_ascend.engine.cpu.dual_linear import (
    BF16_TILES,
    SMALL_BATCH_ROWS,
    DualLinear,
    output_heavy,
    takes_f32_tiles,
    torch_rows_product,
)
from langchain_ascend.engine.cpu.quantized_layout import pack_quantized_linears
from langchain_ascend.engine.hook_types import WEIGHT_LAYOUTS
from langchain_ascend.native import matvec

logger = logging.getLogger(__name__)

LAYOUTS = WEIGHT_LAYOUTS
DUAL_MAX_RAM_SHARE = 0.25
"""``"auto"`` picks ``"dual"`` only while the copies take at most this share of free RAM."""
BF16_PROBE_ROWS = (1, 16, 64, 256)
"""Row counts :func:`tune_bf16_native_rows` times, ascending (it stops at the first loss)."""
F32_PROBE_ROWS = (2, 8, 16, 32, 64)
"""Row counts :func:`tune_f32_native_rows` times, ascending (it stops at the first loss)."""
BF16_PROBE_REPEATS = 3
"""Timed runs of each product per probe after one warm-up run; the fastest counts."""


def _linears(model: Any, skip: Any = ()) -> list[Any]:
    """The model's ``nn.Linear`` layers (``DualLinear`` ones included), except the modules in
    ``skip`` (members of fused groups: their product is the group's,
    ``engine.cpu.fused_projections``)."""
    import torch

    skipped = {id(module) for module in skip}
    return [m for m in model.modules()
            if isinstance(m, torch.nn.Linear) and id(m) not in skipped]


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
                         * (2 if output_heavy(m.weight) or m.out_features % 8 == 0 else 1)
                         for m in _linears(model))
    elif first.dtype == torch.bfloat16 and matvec.bf16_available():
        copy_bytes = sum(m.weight.numel() * m.weight.element_size() for m in _linears(model))
    else:
        return "row"
    free = platform.memory_info(first.device).free
    return "dual" if copy_bytes <= DUAL_MAX_RAM_SHARE * free else "row"


def current_layout(module: Any) -> str:
    """The layout one ``nn.Linear`` is in now."""
    if isinstance(module, DualLinear):
        return "dual"
    weight = module.weight
    return "column" if weight.dim() == 2 and weight.stride() == (1, weight.shape[0]) else "row"


def make_dual(module: Any) -> DualLinear:
    """The ``"dual"`` layer over one row-major ``nn.Linear``'s parameters (itself if it is
    one already)."""
    return module if isinstance(module, DualLinear) else DualLinear.of(module)


def apply_layout(model: Any, layout: str, skip: Any = (), fused: Any = ()) -> int:
    """Lay out every ``nn.Linear`` of ``model`` but those in ``skip`` as ``"row"``,
    ``"column"`` or ``"dual"`` (a :class:`DualLinear` in its place), and re-lay every quantized
    linear, the ``fused`` groups' included (``quantized_layout.pack_quantized_linears``, any
    layout).

    Returns:
        How many linear layers changed layout.
    """
    import torch

    changed = pack_quantized_linears(model, fused)
    places = {id(module): (parent, name) for parent in model.modules()
              for name, module in parent.named_children()}
    with torch.no_grad():
        for module in _linears(model, skip):
            before = current_layout(module)
            if before == layout:
                continue
            replacement = module
            if before == "dual":
                replacement = module.plain()  # back to nn.Linear over the same parameters
            elif before == "column":
                module.weight.data = module.weight.data.contiguous()  # (out, in), row-major
            if layout == "column":
                replacement.weight.data = replacement.weight.data.t().contiguous().t()
            elif layout == "dual":
                replacement = make_dual(module)
            if replacement is not module and id(module) in places:
                parent, name = places[id(module)]
                setattr(parent, name, replacement)
            changed += 1
    if changed:
        logger.info("laid out %d linear layers as %r", changed, layout)
    return changed


def dual_linears(model: Any, extra: Any = ()) -> list[Any]:
    """The :class:`DualLinear` layers of ``model`` and of ``extra`` (fused groups' products,
    not registered as modules), each once."""
    found: dict[int, Any] = {}
    for module in [*model.modules(), *extra]:
        if isinstance(module, DualLinear):
            found.setdefault(id(module), module)
    return list(found.values())


def bf16_tiled_linears(linears: Any) -> list[Any]:
    """The ``"dual"`` ``linears`` on the native bf16 kernel."""
    return [m for m in linears if m.single_row_mode == BF16_TILES and m.bf16_tiles is not None]


def f32_tileable_linears(linears: Any) -> list[Any]:
    """The float32 ``"dual"`` ``linears`` the native rows kernel can take
    (:func:`~langchain_ascend.engine.cpu.dual_linear.takes_f32_tiles`)."""
    return [m for m in linears
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
        lambda rows: torch_rows_product(linear, rows), linear.in_features, torch.float32,
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


def tune_bf16_native_rows(dual: Any) -> int | None:
    """Measure where the native bf16 kernel wins (:func:`measure_native_max_rows` on
    :func:`representative_linear`) and set that as ``native_max_rows`` of every bf16 layer of
    the ``dual`` linears (:func:`dual_linears`).

    Returns:
        The row limit chosen, or None when no layer is on the native bf16 kernel.
    """
    linears = bf16_tiled_linears(dual)
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


def tune_f32_native_rows(dual: Any) -> int | None:
    """Measure up to how many rows the native float32 rows kernel beats torch
    (:func:`measure_native_max_rows` on :func:`representative_linear`) and apply that limit
    to every float32 layer of the ``dual`` linears the kernel can take
    (:func:`set_f32_native_rows`).

    Returns:
        The row limit measured, or None when no layer can take the kernel.
    """
    linears = f32_tileable_linears(dual)
    if not linears:
        return None
    limit = _measure_on_representative(linears, "float32")
    for linear in linears:
        set_f32_native_rows(linear, limit)
    return limit
