"""Quantized linears on accelerators: a weight's GGUF blocks turned, once per layer, into the
tensors of each backend's weight-only matmul, and the product that uses them.

Notation, per block of 32 inputs of one output row (``formats``): ``q`` the stored values, ``d``
the scale, ``m`` the min (``q4_1``); the weight is ``(q - 8) d`` (q4_0), ``q d + m`` (q4_1),
``q d`` (q8_0). A block is one (group of 32 inputs, output column) of the ops below.

**NPU** -- ``torch_npu.npu_weight_quant_batchmatmul(x (M, K) fp16/bf16, weight (K, N),
antiquant_scale (K/32, N), antiquant_offset, bias=..., antiquant_group_size=32)`` computes
``x @ ((weight + offset) * scale) + bias`` (op-plugin docs; scale and offset in ``x``'s dtype;
bias float32 for bf16 ``x``, fp16 for fp16 ``x``; K and N at most 65,535; group size a
multiple of 32 in [32, K - 1], so K == 32 runs per channel, group size 0, the same (1, N)
scales):

* q8_0 -> int8 ``weight = q``, ``scale = d``, no offset;
* q4_0 -> int4 ``weight = q - 8`` (int32 values in [-8, 7], (K, N), packed to (K, N/8) by
  ``npu_convert_weight_to_int4pack``), ``scale = d``, no offset;
* q4_1 -> int4 ``weight = q - 8``, ``scale = d``, ``offset = m / d + 8``:
  ``(q - 8 + m/d + 8) d = q d + m``. A block where that offset cannot be held -- ``d == 0``, or
  ``|m/d + 8| > 2**15`` (fp16 overflows at 65,504) -- becomes a constant: ``weight = 0``,
  ``scale = m + 7.5 d``, ``offset = 1``, i.e. ``(0 + 1) (m + 7.5 d)``. That is exactly ``m``
  where ``d == 0`` (every value of such a block is ``m``); elsewhere off by at most ``7.5 |d|
  < |m| 2**-12``, under fp16's rounding of ``m``.

N wider than 65,535 (a large vocabulary's head) runs as column chunks of at most 65,528
(a multiple of 8); int4 columns are padded to a multiple of 8 with zero weights and scales.
K wider than 65,535 has no mapping: such a layer runs a de-quantized weight (below).

**CUDA** -- ``torch.ops.aten._weight_int4pack_mm(x (M, K) bf16, packed, 32, scales_and_zeros
(K/32, N, 2) bf16)`` computes ``x @ ((u - 8) * scale + zero)^T`` with ``u`` the unsigned
nibble 0..15 (aten/src/ATen/native/cuda/int4mm.cu: "dequant = (bf16(int4_value) * bf16_scale)
+ bf16_zero", int4 in [-8, 7]; torch's own tests quantize with ``zero = min + 8 scale``);
``packed = _convert_weight_to_int4pack(uint8 (N, K/2), inner_k_tiles)`` whose byte ``j`` of a
row is ``u[2j] << 4 | u[2j + 1]``; x must be bf16 and contiguous, sm80 or newer:

* q4_0 -> ``u = q``, ``scale = d``, ``zero = 0``;
* q4_1 -> ``u = q``, ``scale = d``, ``zero = m + 8 d`` (``d == 0`` needs nothing special).

q8_0 has no CUDA op: ``_weight_int8pack_mm`` takes one scale per output row, not one per
32 inputs, so a q8_0 layer (and any layer on a GPU older than sm80) is de-quantized once, at
conversion, to a weight in the activations' dtype and runs ``F.linear`` (logged once).

Everything here but the calls themselves is a pure function of the blocks, tested on the CPU
against ``formats.dequantize``; the real ops are checked only where a device exists
(``tests/quant/test_device_matmul_devices.py``; the NPU path is untested on hardware).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend.platform import import_torch_npu
from langchain_ascend.quant import formats

if TYPE_CHECKING:
    import torch

    from langchain_ascend.quant.formats import QuantizedWeight

logger = logging.getLogger(__name__)

GROUP_SIZE = formats.BLOCK_SIZE
"""Inputs per scale: one GGUF block."""
NPU_MAX_DIM = 65535
"""Largest K and N ``npu_weight_quant_batchmatmul`` takes."""
NPU_CHUNK_COLUMNS = 65528
"""Widest column chunk of one NPU call (the largest multiple of 8 under the limit)."""
INT4_PER_INT32 = 8
"""int4 values per int32 word; int4 weights' N is padded to a multiple of it."""
OFFSET_LIMIT = 2.0 ** 15
"""Largest ``|m/d + 8|`` kept as an NPU offset (fp16 holds up to 65,504)."""
ACCELERATORS = ("npu", "cuda")
"""Device types with a product here."""

_LOGGED: set[str] = set()


def backend_for(device: torch.device) -> str:
    """``"npu"``, ``"cuda"`` or another device type (``"cpu"``...): the product
    :class:`~langchain_ascend.quant.linear.QuantizedLinear` runs on ``device`` (tests point
    it at a stand-in backend)."""
    return device.type


@dataclass(frozen=True)
class NPUGroups:
    """A weight in ``npu_weight_quant_batchmatmul``'s terms, on the CPU, not yet packed.

    Attributes:
        values: ``(K, N)``: int8 ``q`` (q8_0), or int32 in [-8, 7] (4-bit formats).
        scale: float32 ``(K/32, N)``.
        offset: float32 ``(K/32, N)`` (q4_1), else None. De-quantized weight (K, N) =
            ``(values + offset) * scale``, each scale row repeated for its 32 inputs.
    """

    values: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None


@dataclass(frozen=True)
class CUDAGroups:
    """A 4-bit weight in ``_weight_int4pack_mm``'s terms, on the CPU, not yet packed.

    Attributes:
        nibbles: int32 ``(N, K)`` in 0..15.
        scale: float32 ``(K/32, N)``.
        zero: float32 ``(K/32, N)``. De-quantized weight (N, K) = ``(nibbles - 8) * scale +
            zero``, per group of 32 inputs.
    """

    nibbles: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


def _on_host(qw: QuantizedWeight) -> QuantizedWeight:
    """``qw`` with its blocks copied to the CPU (where ``formats`` reads them)."""
    return dataclasses.replace(qw, blocks=qw.blocks.cpu())


def _unpacked(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``formats.unpack`` of ``qw``'s blocks copied to the CPU."""
    return formats.unpack(_on_host(qw))  # (N, B, 32), (N, B), (N, B) | None


def npu_groups(qw: QuantizedWeight) -> NPUGroups:
    """``qw`` as int values, scales and offsets for the NPU op (module docstring)."""
    import torch

    q, d, m = _unpacked(qw)  # (N, B, 32) int16, (N, B), (N, B)
    offset = None
    if qw.fmt == "q8_0":
        values = q.to(torch.int8)  # (N, B, 32)
    else:
        values = (q - 8).to(torch.int32)  # (N, B, 32) in [-8, 7]
    if qw.fmt == "q4_1":
        assert m is not None
        offset = m / torch.where(d == 0, torch.ones_like(d), d) + 8  # (N, B)
        constant = (d == 0) | ~(offset.abs() <= OFFSET_LIMIT)  # (N, B), NaN-safe
        offset = torch.where(constant, torch.ones_like(offset), offset)
        d = torch.where(constant, m + 7.5 * d, d)  # (N, B)
        values = values.masked_fill(constant[..., None], 0)  # (N, B, 32)
    k = qw.in_features
    return NPUGroups(values.reshape(qw.out_features, k).T.contiguous(),  # (K, N)
                     d.T.contiguous(),  # (B, N)
                     None if offset is None else offset.T.contiguous())  # (B, N)


def npu_dequantized(groups: NPUGroups) -> torch.Tensor:
    """The op's documented ``(weight + offset) * scale`` on the CPU: float32 ``(N, K)``."""
    import torch

    scale = groups.scale.repeat_interleave(GROUP_SIZE, dim=0)  # (K, N)
    values = groups.values.to(torch.float32)  # (K, N)
    if groups.offset is not None:
        values = values + groups.offset.repeat_interleave(GROUP_SIZE, dim=0)
    return (values * scale).T  # (N, K)


def cuda_groups(qw: QuantizedWeight) -> CUDAGroups:
    """A 4-bit ``qw`` as nibbles, scales and zeros for ``_weight_int4pack_mm``.

    Raises:
        ValueError: ``qw`` is q8_0 (no CUDA op takes it).
    """
    import torch

    if qw.fmt == "q8_0":
        raise ValueError("q8_0 has no per-group int8 op on CUDA; de-quantize it instead")
    q, d, m = _unpacked(qw)  # (N, B, 32), (N, B), (N, B)
    zero = torch.zeros_like(d) if m is None else m + 8 * d  # (N, B)
    return CUDAGroups(q.to(torch.int32).reshape(qw.out_features, qw.in_features),  # (N, K)
                      d.T.contiguous(), zero.T.contiguous())  # (B, N), (B, N)


def cuda_dequantized(groups: CUDAGroups) -> torch.Tensor:
    """The op's ``(u - 8) * scale + zero`` on the CPU: float32 ``(N, K)``."""
    import torch

    scale = groups.scale.T.repeat_interleave(GROUP_SIZE, dim=1)  # (N, K)
    zero = groups.zero.T.repeat_interleave(GROUP_SIZE, dim=1)  # (N, K)
    return (groups.nibbles - 8).to(torch.float32) * scale + zero  # (N, K)


def cuda_nibble_bytes(nibbles: torch.Tensor) -> torch.Tensor:
    """int ``(N, K)`` in 0..15 -> uint8 ``(N, K/2)``, byte j = ``u[2j] << 4 | u[2j+1]``: the
    input ``_convert_weight_to_int4pack`` takes on CUDA."""
    import torch

    return ((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).to(torch.uint8)  # (N, K/2)


def padded_to(tensor: torch.Tensor, size: int, dim: int, value: float = 0) -> torch.Tensor:
    """``tensor`` padded with ``value`` along ``dim`` to ``size``."""
    import torch

    missing = size - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, torch.full(shape, value, dtype=tensor.dtype)], dim=dim)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _log_once(key: str, message: str) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.info(message)


def npu_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The activation dtype the NPU op runs for ``dtype`` activations (fp16 stays, anything
    else runs in bf16)."""
    import torch

    return torch.float16 if dtype == torch.float16 else torch.bfloat16


class DeviceMatmul:
    """One layer's product on an accelerator, its tensors converted once (base class).

    Attributes:
        device: Where the tensors live.
        dtype: The activations' dtype they were converted for; a call with another dtype
            needs a new one (``QuantizedLinear`` rebuilds it once).
        out_features: N.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, out_features: int) -> None:
        self.device = device
        self.dtype = dtype
        self.out_features = out_features

    def serves(self, x: torch.Tensor) -> bool:
        """Whether this product was converted for ``x``'s device and dtype."""
        return x.device == self.device and x.dtype == self.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x (M, K)`` -> ``(M, N)`` in ``x``'s dtype, bias included."""
        raise NotImplementedError


class DenseMatmul(DeviceMatmul):
    """The weight de-quantized once to ``dtype`` and ``F.linear``: for layers no
    weight-only op takes (CUDA q8_0 or pre-sm80, NPU K > 65,535)."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(device, dtype, qw.out_features)
        self.weight = formats.dequantize(_on_host(qw)).to(device=device, dtype=dtype)  # (N, K)
        self.bias = None if bias is None else bias.detach().to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.nn.functional.linear(x, self.weight, self.bias)  # (M, N)


@dataclass(frozen=True)
class _NPUChunk:
    """Columns ``start:stop`` of an NPU weight (``width`` padded columns)."""

    start: int
    stop: int
    weight: torch.Tensor  # int8 (K, width) or int32 (K, width / 8)
    scale: torch.Tensor  # (K/32, width) in the compute dtype
    offset: torch.Tensor | None  # like scale
    bias: torch.Tensor | None  # (width,) float32 (bf16 x) or fp16 (fp16 x)


class NPUMatmul(DeviceMatmul):
    """``npu_weight_quant_batchmatmul`` over tensors converted once (module docstring)."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, device: torch.device,
                 dtype: torch.dtype) -> None:
        import torch

        super().__init__(device, dtype, qw.out_features)
        torch_npu = import_torch_npu("quantized linears on an NPU")
        self.convert_op = torch_npu.npu_convert_weight_to_int4pack  # the ops, not the module:
        self.matmul_op = torch_npu.npu_weight_quant_batchmatmul  # deepcopy-able
        self.compute_dtype = npu_compute_dtype(dtype)
        bias_dtype = torch.float16 if self.compute_dtype == torch.float16 else torch.float32
        self.group_size = GROUP_SIZE if qw.in_features > GROUP_SIZE else 0  # 0: per channel
        groups = npu_groups(qw)
        host_bias = None if bias is None else bias.detach().float().cpu()  # (N,)
        self.chunks = [
            self._chunk(groups, host_bias, start, min(start + NPU_CHUNK_COLUMNS, qw.out_features),
                        qw.fmt != "q8_0", bias_dtype)
            for start in range(0, qw.out_features, NPU_CHUNK_COLUMNS)]

    def _chunk(self, groups: NPUGroups, bias: torch.Tensor | None, start: int, stop: int,
               int4: bool, bias_dtype: torch.dtype) -> _NPUChunk:
        """Columns ``start:stop`` on the device (int4: padded to a multiple of 8, packed)."""
        width = _round_up(stop - start, INT4_PER_INT32) if int4 else stop - start

        def put(t: torch.Tensor | None, dtype: torch.dtype, dim: int = 1) -> Any:
            if t is None:
                return None
            part = padded_to(t.narrow(dim, start, stop - start), width, dim)
            return part.contiguous().to(device=self.device, dtype=dtype)

        weight = put(groups.values, groups.values.dtype)  # (K, width) int8 / int32
        if int4:
            weight = self.convert_op(weight)  # (K, width / 8)
        return _NPUChunk(start, stop, weight, put(groups.scale, self.compute_dtype),
                         put(groups.offset, self.compute_dtype), put(bias, bias_dtype, 0))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        xc = x.to(self.compute_dtype)  # (M, K)
        outs = []
        for chunk in self.chunks:
            out = self.matmul_op(
                xc, chunk.weight, chunk.scale, antiquant_offset=chunk.offset, bias=chunk.bias,
                antiquant_group_size=self.group_size)  # (M, width)
            outs.append(out[:, : chunk.stop - chunk.start])  # (M, stop - start)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # (M, N)
        return out.to(x.dtype)


def cuda_inner_k_tiles(in_features: int) -> int:
    """The widest ``inner_k_tiles`` (8, 4 or 2) whose ``16 * tiles`` divides K."""
    return next(tiles for tiles in (8, 4, 2) if in_features % (16 * tiles) == 0)


class CUDAInt4Matmul(DeviceMatmul):
    """``_weight_int4pack_mm`` over tensors converted once (module docstring). Activations
    run in bf16 (the only dtype the op takes); the output comes back in ``x``'s dtype."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, device: torch.device,
                 dtype: torch.dtype) -> None:
        import torch

        super().__init__(device, dtype, qw.out_features)
        groups = cuda_groups(qw)
        rows = _round_up(qw.out_features, INT4_PER_INT32)  # padded N
        nibbles = padded_to(groups.nibbles, rows, 0, value=8)  # (rows, K): pads are 0
        self.inner_k_tiles = cuda_inner_k_tiles(qw.in_features)
        self.weight = torch.ops.aten._convert_weight_to_int4pack(
            cuda_nibble_bytes(nibbles).contiguous().to(device), self.inner_k_tiles)
        scale = padded_to(groups.scale, rows, 1)  # (B, rows)
        zero = padded_to(groups.zero, rows, 1)  # (B, rows)
        self.scales_and_zeros = torch.stack([scale, zero], dim=-1).to(
            device=device, dtype=torch.bfloat16).contiguous()  # (B, rows, 2)
        self.bias = None if bias is None else bias.detach().to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        out = torch.ops.aten._weight_int4pack_mm(
            x.to(torch.bfloat16).contiguous(), self.weight, GROUP_SIZE,
            self.scales_and_zeros)  # (M, rows) bf16
        out = out[:, : self.out_features].to(x.dtype)  # (M, N)
        return out if self.bias is None else out + self.bias


def _cuda_has_int4(device: torch.device) -> bool:
    import torch

    return torch.cuda.get_device_capability(device) >= (8, 0)


def build(qw: QuantizedWeight, bias: torch.Tensor | None, device: torch.device,
          dtype: torch.dtype) -> DeviceMatmul:
    """``qw``'s product on ``device`` for activations of ``dtype``: its tensors converted and
    moved once.

    Args:
        qw: The weight (blocks anywhere; read on the CPU).
        bias: ``(N,)`` or None.
        device: An NPU or CUDA device (``backend_for(device)`` in :data:`ACCELERATORS`).
        dtype: The activations' dtype.

    Raises:
        ValueError: ``device`` has no product here.
        DeviceUnavailableError: An NPU without a usable torch_npu.
    """
    kind = backend_for(device)
    if kind not in ("npu", "cuda"):
        raise ValueError(f"no quantized device product for {device}")
    if qw.fmt not in formats.X8_FORMATS:
        _log_once(f"{kind}-{qw.fmt}", f"{qw.fmt} linears run a weight de-quantized once to "
                  f"{dtype} on {kind} (the weight-only device ops here take 32-value blocks "
                  f"with one scale: {', '.join(formats.X8_FORMATS)})")
        return DenseMatmul(qw, bias, device, dtype)
    if kind == "npu":
        if qw.in_features <= NPU_MAX_DIM:
            return NPUMatmul(qw, bias, device, dtype)
        _log_once("npu-k", f"quantized linears with K > {NPU_MAX_DIM} run a de-quantized "
                           "weight on the NPU (npu_weight_quant_batchmatmul's limit)")
    elif kind == "cuda":
        if qw.fmt != "q8_0" and _cuda_has_int4(device):
            return CUDAInt4Matmul(qw, bias, device, dtype)
        _log_once(f"cuda-{qw.fmt}", f"{qw.fmt} linears run a weight de-quantized once to "
                  f"{dtype} on CUDA (no per-group int8 op in torch; int4 needs sm80+)")
    return DenseMatmul(qw, bias, device, dtype)
