"""A linear layer whose weight stays in a block format (``q4_0``, ``q4_1``, ``q8_0``).

:class:`QuantizedLinear` holds only the weight's blocks (``formats.QuantizedWeight``) and its
bias. Its product is the native ``qmatmul`` kernel where it is built (activations quantized to
int8 per block of 32, as llama.cpp does: ``native.qmatmul``); elsewhere, or with
``use_native=False`` (the weights-only reference, e.g. to compare against the de-quantized float
model), a torch product on float activations that de-quantizes a slice of output rows at a time
(at most :data:`FALLBACK_CHUNK_VALUES` float32 weights alive at once), so no float copy of the
weight is ever kept. On an NPU or a CUDA device the product is the backend's weight-only
matmul over tensors converted once per layer, when the layer is moved there (``.to()``) or at
its first product there (:mod:`langchain_ascend.quant.device_matmul`).

:func:`replace_linears` swaps a model's ``nn.Linear`` layers for quantized ones in place, as a
plan decides per layer, and lets the float weights go.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from langchain_ascend.native import qmatmul
from langchain_ascend.platform import default_dtype
from langchain_ascend.quant import device_matmul, formats
from langchain_ascend.quant.embedding import QuantizedEmbedding

if TYPE_CHECKING:
    from langchain_ascend.quant.formats import QuantizedWeight

logger = logging.getLogger(__name__)

FALLBACK_CHUNK_VALUES = 1 << 20
"""Weights the torch fallback de-quantizes per slice of output rows (4 MiB of float32)."""

Plan = Callable[[str, nn.Linear], "QuantizedWeight | None"]
"""``plan(qualified name, layer)``: the layer's quantized weight, or None to keep it float."""


def _native_qmatmul() -> Callable[..., torch.Tensor] | None:
    """``native.qmatmul.qmatmul`` where its kernel is built here, else None (looked up once
    per process; the first look builds the kernel)."""
    global _NATIVE
    if _NATIVE is _UNSET:
        _NATIVE = qmatmul.qmatmul if qmatmul.available() else None
    return _NATIVE  # type: ignore[return-value]


_UNSET = object()
_NATIVE: Any = _UNSET


def dequantized_rows(qw: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
    """Float32 ``(stop - start, in_features)``: rows ``start:stop`` of ``qw`` de-quantized
    (any layout; ``"x8"`` bounds in whole groups of 8 rows)."""
    return formats.dequantize(formats.rows(qw, start, stop))  # (rows, K)


def reference_matmul(x: torch.Tensor, qw: QuantizedWeight,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (M, K) @ dequantize(qw).T (+ bias)`` in float32, de-quantizing
    :data:`FALLBACK_CHUNK_VALUES` weights at a time: ``(M, N)`` float32."""
    x = x.to(torch.float32)  # (M, K)
    group = formats.ROWS_PER_GROUP if qw.layout == "x8" else 1
    rows_per_chunk = max(1, FALLBACK_CHUNK_VALUES // qw.in_features // group) * group
    if rows_per_chunk >= qw.out_features:
        return torch.nn.functional.linear(x, formats.dequantize(qw),
                                          None if bias is None else bias.float())  # (M, N)
    out = torch.empty(x.shape[0], qw.out_features, dtype=torch.float32,
                      device=x.device)  # (M, N)
    for start in range(0, qw.out_features, rows_per_chunk):
        stop = min(start + rows_per_chunk, qw.out_features)
        torch.matmul(x, dequantized_rows(qw, start, stop).T, out=out[:, start:stop])
    if bias is not None:
        out += bias.float()  # (M, N)
    return out


class QuantizedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` kept as blocks.

    Args:
        qweight: The weight, ``(out_features, in_features)`` in a block format.
        bias: ``(out_features,)`` float tensor (kept as a Parameter), or None.

    Attributes:
        in_features: K.
        out_features: N.
        qweight: The :class:`~langchain_ascend.quant.formats.QuantizedWeight`; its
            ``blocks`` tensor is also this module's non-persistent buffer ``blocks`` (so
            ``.to(device)`` moves it).
        bias: Parameter or None.
        use_native: Use the native kernel where built (set False to force the torch
            fallback, e.g. as the reference in tests).
        device_product: On an NPU / CUDA device: the product's converted tensors
            (:class:`~langchain_ascend.quant.device_matmul.DeviceMatmul`), built when the
            module moves there and rebuilt once when the activations' device or dtype
            changes; None elsewhere. The ``blocks`` stay too (the weight's record).
    """

    blocks: torch.Tensor

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features = qweight.in_features
        self.out_features = qweight.out_features
        self.fmt = qweight.fmt
        self.layout = qweight.layout
        self.register_buffer("blocks", qweight.blocks, persistent=False)
        self._qweight = qweight
        if bias is not None:
            if tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias of shape {tuple(bias.shape)} for a linear of "
                                 f"{self.out_features} outputs")
            self.bias: nn.Parameter | None = nn.Parameter(bias.detach(), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.use_native = True
        self.device_product: device_matmul.DeviceMatmul | None = None

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> QuantizedLinear:
        """``nn.Module._apply`` (``.to()``, ``.cuda()``, ``.half()``...), then the device
        product converted for where the blocks now are."""
        super()._apply(fn, recurse)
        device = self.blocks.device
        self.device_product = None
        if device_matmul.backend_for(device) in device_matmul.ACCELERATORS:
            self.device_product = device_matmul.build(self.qweight, self.bias, device,
                                                     self._expected_dtype(device))
        return self

    def _expected_dtype(self, device: torch.device) -> torch.dtype:
        """The activations' dtype to convert for before any has been seen: the bias's when it
        is a 16-bit float, else the device's default."""
        if self.bias is not None and self.bias.dtype in (torch.float16, torch.bfloat16):
            return self.bias.dtype
        return default_dtype(device)

    def _run_on_device(self, x: torch.Tensor) -> torch.Tensor:
        """``x (M, K)`` on an accelerator -> ``(M, N)`` through the converted tensors."""
        product = self.device_product
        if product is None or not product.serves(x):
            product = device_matmul.build(self.qweight, self.bias, x.device, x.dtype)
            self.device_product = product
        return product(x)  # (M, N)

    def hold(self, qweight: QuantizedWeight) -> None:
        """Hold ``qweight`` instead: the same weight in another layout or storage (a view of a
        fused group's blocks, say), so the layer's product reads it from there.

        Raises:
            ValueError: ``qweight`` has another shape.
        """
        if qweight.shape != (self.out_features, self.in_features):
            raise ValueError(f"a weight of shape {qweight.shape} for a linear of shape "
                             f"{(self.out_features, self.in_features)}")
        self.fmt, self.layout, self._qweight = qweight.fmt, qweight.layout, qweight
        self.blocks = qweight.blocks
        self.device_product = None

    @property
    def qweight(self) -> QuantizedWeight:
        """The weight (rebuilt when ``.to()`` replaced the ``blocks`` buffer)."""
        blocks = self.blocks
        if self._qweight.blocks is not blocks:
            self._qweight = formats.QuantizedWeight(self.fmt, self.out_features,
                                                    self.in_features, blocks, self.layout)
        return self._qweight

    @property
    def weight_bytes(self) -> int:
        """Bytes of the blocks (what one product streams), bias excluded."""
        return formats.nbytes(self.qweight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., K)`` float32 / bf16 / fp16 -> ``(..., N)`` in ``x``'s dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"QuantizedLinear({self.in_features} -> {self.out_features}) got "
                             f"an input of shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)  # (M, K)
        if device_matmul.backend_for(flat.device) in device_matmul.ACCELERATORS:
            return self._run_on_device(flat).reshape(*lead, self.out_features)  # (..., N)
        native = _native_qmatmul() if self.use_native else None
        if (native is not None and flat.device.type == "cpu"
                and flat.dtype in (torch.float32, torch.bfloat16)):
            out = native(flat, self.qweight, self.bias)  # (M, N) float32
        else:
            out = reference_matmul(flat, self.qweight, self.bias)  # (M, N)
        return out.to(x.dtype).reshape(*lead, self.out_features)  # (..., N)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"fmt={self.fmt}, layout={self.layout}, bias={self.bias is not None}")


def use_reference(model: nn.Module, reference: bool = True) -> int:
    """Make every :class:`QuantizedLinear` of ``model`` run the weights-only torch reference
    (``reference=True``) or the native kernel where built (False). Returns the layer count."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    for layer in layers:
        layer.use_native = not reference
    return len(layers)


def replace_linears(model: nn.Module, plan: Plan) -> list[str]:
    """Swap ``model``'s ``nn.Linear`` layers for :class:`QuantizedLinear` where ``plan`` gives a
    quantized weight; the float weight is dropped with the old layer (a weight still shared
    with another module, a tied embedding, lives on there).

    Args:
        model: Modified in place.
        plan: ``plan(name, layer)`` -> the layer's weight in a block format, or None to keep
            the layer as it is. Called once per layer, in ``named_modules`` order.

    Returns:
        The qualified names of the replaced layers.

    Raises:
        ValueError: A planned weight's shape is not the layer's.
    """
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear)]
    replaced = []
    for name, linear in targets:
        qweight = plan(name, linear)
        if qweight is None:
            continue
        if qweight.shape != (linear.out_features, linear.in_features):
            raise ValueError(f"{name}: planned weight of shape {qweight.shape} for a linear "
                             f"of shape {(linear.out_features, linear.in_features)}")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        bias = None if linear.bias is None else linear.bias.data
        setattr(parent, child, QuantizedLinear(qweight, bias))
        replaced.append(name)
    return replaced


def quantized_weight_bytes(model: nn.Module) -> int:
    """Bytes of the blocks of every :class:`QuantizedLinear` and ``QuantizedEmbedding`` of
    ``model``, each storage once (a tied head and its embedding, a fused group and its members'
    views, share one)."""
    storages: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear) or _is_quantized_embedding(module):
            blocks = module.blocks
            assert isinstance(blocks, torch.Tensor)
            storage = blocks.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _is_quantized_embedding(module: nn.Module) -> bool:
    return isinstance(module, QuantizedEmbedding)
