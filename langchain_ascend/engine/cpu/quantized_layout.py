"""Quantized linears on the CPU: the ``"x8"`` block layout for the native product.

A ``quant.linear.QuantizedLinear`` keeps its weight as GGUF blocks (``quant.formats``). The
native product (``native.qmatmul``) runs the file's layout, and about twice as fast the
``"x8"`` layout: the very same bytes interleaved by 8 output rows (measurements in
``docs/performance.md``). :func:`pack_quantized_linears` re-lays every quantized linear of a
prepared model in ``"x8"``, each replaced by a ``QuantizedLinear`` over the re-laid blocks
(same bias tensor): fused q/k/v and gate/up groups (``engine.cpu.fused_projections``) get one
re-laid fused product and their members views of it, re-wired to the group (where the group
was not concatenated in ``"x8"`` already: :func:`fused_layout`). No extra memory, except for
blocks another module also reads (a tied embedding table): those are re-laid into a copy only
while it fits :data:`SHARED_PACK_MAX_RAM_SHARE` of the free RAM. Blocks read in place from a
GGUF file's map give their pages back once re-laid (``quant.gguf_file.release_pages``).

Fused members in different formats (a Q4_K_M file's q/k in ``Q4_K`` and v in ``Q6_K``) cannot
share one weight: :class:`QuantizedParts` runs them as one product over their own blocks, each
part re-laid on its own.

The layout takes ``formats.X8_LAYOUT_FORMATS`` (the K-quants too). A weight with
``out_features % 8 != 0`` (or a group with such a member), and Q5_0/Q5_1, keep the file's
layout; both layouts give a row the same result whatever the batch.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_ascend import platform
from langchain_ascend.native import qmatmul
from langchain_ascend.quant import formats
from langchain_ascend.quant.gguf_file import release_pages

logger = logging.getLogger(__name__)

SHARED_PACK_MAX_RAM_SHARE = 0.1
"""Blocks shared with another module are re-laid into a copy only while it takes at most this
share of free RAM."""


def is_quantized_linear(module: Any) -> bool:
    """Whether ``module`` is a ``quant.linear.QuantizedLinear`` (weight kept as blocks)."""
    from langchain_ascend.quant.linear import QuantizedLinear

    return isinstance(module, QuantizedLinear)


class QuantizedParts:
    """Quantized linears on the same input in different block formats as ONE product: each
    part's own blocks and bias (no copy), the outputs side by side -- each part's values are
    its own product's, bit for bit, so the native stack (``native.stack_kernel``, one call per
    part into the same output rows) and the per-op path agree.

    Attributes:
        parts: The ``quant.linear.QuantizedLinear`` members, in output order.
        in_features: Their common input width.
        out_features: The sum of theirs.
    """

    def __init__(self, parts: list[Any]) -> None:
        self.parts = list(parts)
        self.in_features = self.parts[0].in_features
        self.out_features = sum(part.out_features for part in self.parts)

    def forward(self, x: Any) -> Any:
        """``x (..., K)`` -> ``(..., out_features)``: the parts' own products, concatenated."""
        import torch

        return torch.cat([part.forward(x) for part in self.parts], dim=-1)

    __call__ = forward


def is_quantized_product(linear: Any) -> bool:
    """Whether ``linear`` multiplies blocks: a ``QuantizedLinear`` or :class:`QuantizedParts`."""
    return is_quantized_linear(linear) or isinstance(linear, QuantizedParts)


def _block_readers(model: Any) -> dict[int, int]:
    """Storage address -> how many of ``model``'s modules hold a ``blocks`` buffer on it."""
    readers: dict[int, int] = {}
    for module in model.modules():
        blocks = dict(module.named_buffers(recurse=False)).get("blocks")
        if blocks is not None:
            key = blocks.untyped_storage().data_ptr()
            readers[key] = readers.get(key, 0) + 1
    return readers


def _packable(qweight: Any, sizes: list[int], readers: int, members: int) -> bool:
    """Whether a weight (fused group: its members' ``sizes``) read by ``readers`` modules, of
    which ``members`` are the group's own, is worth re-laying in ``"x8"``."""
    group_rows = formats.ROWS_PER_GROUP
    if (qweight.layout == "x8" or qweight.fmt not in formats.X8_LAYOUT_FORMATS
            or qweight.out_features % group_rows
            or any(size % group_rows for size in sizes)):
        return False
    if readers > max(1, members):  # another module reads these bytes: a copy
        free = platform.memory_info(qweight.blocks.device).free
        if formats.nbytes(qweight) > SHARED_PACK_MAX_RAM_SHARE * free:
            return False
        logger.info("re-laying a copy of a (%d, %d) %s weight another module shares",
                    qweight.out_features, qweight.in_features, qweight.fmt)
    return True


def fused_layout(weights: list[Any]) -> str:
    """The layout a fused group of these weights (``formats.QuantizedWeight``) is concatenated
    in: ``"x8"`` where the native product is built and every member is in a format the layout
    takes with whole groups of 8 rows, else the members' own."""
    if (qmatmul.available()
            and all(w.layout == "gguf" and w.fmt in formats.X8_LAYOUT_FORMATS for w in weights)
            and all(w.out_features % formats.ROWS_PER_GROUP == 0 for w in weights)):
        return "x8"
    return weights[0].layout


def pack_quantized_linears(model: Any, fused: Any = ()) -> int:
    """Re-lay every quantized linear of ``model`` and of its ``fused`` projection groups
    (``fused_projections.FusedProjections``) in the ``"x8"`` layout where it can be (module
    docstring), where the native product is built.

    Returns:
        How many weights were re-laid (a fused group counts once).
    """
    from langchain_ascend.quant.linear import QuantizedLinear

    if not qmatmul.available():
        return 0
    readers = _block_readers(model)
    places = {id(module): (parent, name) for parent in model.modules()
              for name, module in parent.named_children()}
    group_of = {id(member): group for group in fused for member in group.members}
    groups: dict[int, Any] = {}
    singles = []
    for module in model.modules():
        group = group_of.get(id(module))
        if group is not None and is_quantized_linear(group.linear):
            groups.setdefault(id(group), group)
        elif group is not None and isinstance(group.linear, QuantizedParts):
            singles.extend(part for part in group.linear.parts if part is module)
        elif group is None and is_quantized_linear(module):
            singles.append(module)
    packed = 0
    for group in groups.values():
        members = list(group.members)
        qweight = group.linear.qweight
        storage = qweight.blocks.untyped_storage().data_ptr()
        if not _packable(qweight, group.sizes, readers.get(storage, 0), len(members)):
            continue
        x8 = formats.to_layout(qweight, "x8")
        release_pages(qweight.blocks)
        group.linear = QuantizedLinear(x8, group.linear.bias)
        replaced, start = [], 0
        for member in members:
            end = start + member.out_features
            replaced.append(QuantizedLinear(formats.rows(x8, start, end), member.bias))
            parent, name = places[id(member)]
            setattr(parent, name, replaced[-1])
            start = end
        group.members = replaced
        packed += 1
    for linear in singles:
        qweight = linear.qweight
        storage = qweight.blocks.untyped_storage().data_ptr()
        if not _packable(qweight, [], readers.get(storage, 0), 1):
            continue
        if id(linear) in group_of:  # a part of a QuantizedParts product: in place
            linear.hold(formats.to_layout(qweight, "x8"))
        else:
            parent, name = places[id(linear)]
            setattr(parent, name, QuantizedLinear(formats.to_layout(qweight, "x8"), linear.bias))
        release_pages(qweight.blocks)  # the GGUF file's pages of what was copied, if any
        packed += 1
    if packed:
        logger.info("re-laid %d quantized weights in the x8 layout", packed)
    return packed
