"""Sibling projections on the same input as one product (CPU, ``"dual"`` weight layout, float32
or bfloat16), for the owned CPU model.

Decoder layers compute ``q_proj``, ``k_proj`` and ``v_proj`` on the same hidden states, and
``gate_proj`` and ``up_proj`` on the same MLP input. A CPU decode step pays per call, and the
small K/V projections stream their weights badly, so the owned models
(``engine.cpu.models``) run each group as ONE product over the concatenated weight: a
:class:`FusedProjections` holds it, the sizes to split it by and its members.

The members' weights and biases become views of the concatenated tensors (nothing is held
twice) and keep their own ``forward`` (transformers' forward, where it still runs, computes
each member's product on its view); the fused linear is a
``dual_linear.DualLinear`` (for bf16 its row limit for the native kernel is set later, with
the model's other linears, by ``weight_layout.tune_bf16_native_rows``).

Members that are ``quant.linear.QuantizedLinear`` layers of one block format fuse the same way
into one ``QuantizedLinear`` over the concatenated blocks (exact: every output row is its own
blocks), the members' blocks and biases becoming views of the fused ones; it takes no float
layout: the blocks are concatenated straight into the native product's layout where it takes
them (``engine.cpu.quantized_layout.fused_layout``), and the pages of the GGUF file the
members were read from are given back (``quant.gguf_file.release_pages``). Members in
different formats (a Q4_K_M file's v in ``Q6_K`` beside q/k in ``Q4_K``) become one
``quantized_layout.QuantizedParts`` product over their own blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_ascend.engine.cpu.dual_linear import DualLinear
from langchain_ascend.engine.cpu.quantized_layout import (
    QuantizedParts,
    fused_layout,
    is_quantized_linear,
)
from langchain_ascend.quant.formats import concatenate, rows
from langchain_ascend.quant.gguf_file import release_pages

logger = logging.getLogger(__name__)

GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Attribute names of linear layers a module calls in this order on one input."""


class FusedProjections:
    """One product over several members' concatenated weights.

    Args:
        linear: The fused ``DualLinear``, ``QuantizedLinear`` or ``QuantizedParts``
            (``out`` = the members' outputs, in order).
        sizes: Output features of each member.
        members: The member modules, in order (their weights are views of ``linear``'s).
    """

    def __init__(self, linear: Any, sizes: Sequence[int], members: Sequence[Any]) -> None:
        self.linear = linear
        self.sizes = list(sizes)
        self.members = list(members)


def fusable(members: Sequence[Any]) -> bool:
    """Whether these modules can share one product: plain linears on the same input size,
    device and dtype, or quantized linears on the same input size and device (one block
    format, or any formats on the CPU: :class:`QuantizedParts`); all with or all without
    bias."""
    import torch

    if members and all(is_quantized_linear(m) for m in members):
        first = members[0]
        one_format = all(m.fmt == first.fmt for m in members)
        return (all(m.in_features == first.in_features
                    and m.blocks.device == first.blocks.device for m in members)
                and (one_format or first.blocks.device.type == "cpu")
                and all((m.bias is None) == (first.bias is None) for m in members)
                and (first.bias is None
                     or all(m.bias.dtype == first.bias.dtype for m in members)))
    if not members or not all(isinstance(m, torch.nn.Linear) for m in members):
        return False
    first = members[0]
    return (all(m.in_features == first.in_features for m in members)
            and all((m.bias is None) == (first.bias is None) for m in members)
            and all(m.weight.dtype == first.weight.dtype for m in members)
            and all(m.weight.device == first.weight.device for m in members))


def fuse_group(members: Sequence[Any]) -> FusedProjections:
    """Fuse ``members`` (checked with :func:`fusable`, in the order the model calls them)
    into one product."""
    first = members[0]
    linear = _fuse_quantized(members) if is_quantized_linear(first) else _fuse_float(members)
    return FusedProjections(linear, [m.out_features for m in members], members)


def _fuse_quantized(members: Sequence[Any]) -> Any:
    """One ``QuantizedLinear`` over the members' concatenated blocks (and biases), the members
    keeping views of them; members in different formats: their :class:`QuantizedParts`."""
    import torch

    from langchain_ascend.quant.linear import QuantizedLinear

    if any(m.fmt != members[0].fmt for m in members):
        return QuantizedParts(list(members))
    weights = [m.qweight for m in members]
    qweight = concatenate(weights, fused_layout(weights))  # blocks (sum(out) [/ 8], bytes)
    with torch.no_grad():
        bias = (None if members[0].bias is None
                else torch.cat([m.bias.data for m in members]))  # (sum(out),)
        linear = QuantizedLinear(qweight, bias)
        fused_bias = linear.bias
        start = 0
        for m, weight in zip(members, weights, strict=True):
            end = start + m.out_features
            m.hold(rows(qweight, start, end))  # a view of the fused blocks
            release_pages(weight.blocks)  # the file's pages of what was copied
            if fused_bias is not None:
                m.bias.data = fused_bias.data[start:end]
            start = end
    return linear


def _fuse_float(members: Sequence[Any]) -> Any:
    """One ``DualLinear`` over the members' concatenated weights (and biases); the members
    keep views of them."""
    import torch

    first = members[0]
    with torch.no_grad():
        weight = torch.cat([m.weight.data for m in members])  # (sum(out), in)
        bias = None if first.bias is None else torch.cat([m.bias.data for m in members])
        linear = torch.nn.Linear(first.in_features, weight.shape[0], bias=bias is not None,
                                 device=weight.device, dtype=weight.dtype)
        linear.weight.data = weight
        if bias is not None:
            linear.bias.data = bias
        start = 0
        for m in members:  # the members keep their parameters, as views of the fused ones
            end = start + m.out_features
            m.weight.data = weight[start:end]
            if bias is not None:
                m.bias.data = bias[start:end]
            start = end
    return DualLinear.of(linear)


def group_of(groups: Sequence[FusedProjections],
             members: Sequence[Any]) -> FusedProjections | None:
    """The group of ``groups`` whose members are exactly ``members``, in order, or None."""
    for group in groups:
        if len(group.members) == len(members) and all(
                a is b for a, b in zip(group.members, members, strict=True)):
            return group
    return None


def fuse_projections(model: Any) -> list[FusedProjections]:
    """Fuse every group of :data:`GROUPS` found in ``model``'s modules.

    Returns:
        The groups fused, in module order.
    """
    groups = []
    for module in list(model.modules()):
        for names in GROUPS:
            members = [getattr(module, name, None) for name in names]
            if fusable(members):
                groups.append(fuse_group(members))
    if groups:
        logger.info("fused %d groups of sibling projections", len(groups))
    return groups
