"""Every decoder layer of a pure-decode step in one native call (``decode_stack.c``).

The kernel runs the per-op path's own kernels (RMSNorm, tiles products, rotary + cache
write, paged attention) layer after layer in C, so a step pays no Python or dispatch time
between them. :class:`DecodeLayer` is one layer's weights and cache as the kernel reads them;
:func:`run_stack` checks the step's tensors and calls it. The model-facing side (which
models, which steps) is ``engine.cpu.models.llama`` (its packed layers: ``engine.cpu.packed_layers``).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from langchain_ascend.native import build, qmatmul

if TYPE_CHECKING:
    import torch

KERNEL = "decode_stack"
DTYPE_CODES = {"float32": 0, "bfloat16": 1}
"""The kernel's dtype argument by ``str(torch dtype)`` without the ``torch.`` prefix."""


PRODUCT_PARTS = 255
"""The kind code of a product in parts of different formats: its weight pointer holds the
table :func:`parts_table` writes (``decode_stack.c``)."""


def parts_table(parts: list[tuple[int, int, int, int]]) -> Any:
    """int64 ``(1 + 4 * len(parts),)``: the part count, then per part ``(kind code, output
    rows, blocks pointer, float32 bias pointer or 0)`` -- what ``decode_stack.c`` reads for a
    :data:`PRODUCT_PARTS` product (pure function of the numbers)."""
    import torch

    return torch.tensor([len(parts), *(v for part in parts for v in part)], dtype=torch.int64)


def product_code(fmt: str | None = None, layout: str = "gguf") -> int:
    """A product's weight kind in :class:`DecodeLayer` (``*_fmt``, pure function): 0 for tiles
    of the model's dtype (``fmt`` None), else ``1 + format + 16 * layout`` for blocks of a
    ``quant.formats`` format and layout (``native.qmatmul``'s codes)."""
    if fmt is None:
        return 0
    return 1 + qmatmul.FORMAT_CODES[fmt] + 16 * qmatmul.LAYOUT_CODES[layout]


class DecodeLayer(ctypes.Structure):
    """One decoder layer as ``decode_stack.c`` reads it: data pointers (0: none) of the norms
    ``(D,)``, the weights and biases of the q/k/v, output, gate/up and down products, Qwen3's
    per-head norms ``(Dh,)``, the layer's ``(2, KVH, NB, BS, Dh)`` cache, the norms' epsilons,
    the attention scale, the sliding window (0: none), each product's kind
    (:func:`product_code`: ``*_tiles`` points at ``(N/8, K, 8)`` tiles of the model's dtype
    and ``*_bias`` at a bias of that dtype; or at the ``(N, K/32 * block bytes)`` uint8
    blocks and a float32 bias) and ``native.qmatmul``'s variant code."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "norm1", "norm2", "qkv_tiles", "qkv_bias", "q_norm", "k_norm", "o_tiles", "o_bias",
        "gu_tiles", "gu_bias", "down_tiles", "down_bias", "kv_cache")] + [
        (name, ctypes.c_double) for name in ("eps1", "eps2", "head_eps", "scale")] + [
        ("window", ctypes.c_int64)] + [
        (name, ctypes.c_int32) for name in ("qkv_fmt", "o_fmt", "gu_fmt", "down_fmt",
                                            "q_variant")]


def _kernel() -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, "decode_stack", [
        ctypes.c_int, ctypes.POINTER(DecodeLayer), i64, ptr, ptr, ptr, ptr, ptr, i64, ptr,
        i64, i64, i64, i64, i64, i64, i64, i64, i64, ptr, ctypes.c_int])


def _silu_kernel() -> Any:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return build.function(KERNEL, "silu_mul_rows_threads",
                          [ctypes.c_int, ptr, i64, ptr, i64, i64, ctypes.c_int])


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """``silu(gate) * up`` of a fused gate|up product with the stack's own code
    (``decode_stack.c`` ``silu_mul_rows``), so the per-op MLP gives a row the bits the stack
    gives it; None where the kernel does not apply (not built here, another dtype or device,
    rows that are not evenly spaced), the caller then keeping torch's ``F.silu``.

    Args:
        gate_up: ``(..., 2I)`` float32 or bfloat16 on CPU, the gate in the first ``I`` values
            of each row and the up projection in the last ``I``, with contiguous rows.

    Returns:
        ``(..., I)`` of ``gate_up``'s dtype.
    """
    import torch

    code = DTYPE_CODES.get(str(gate_up.dtype).removeprefix("torch."))
    width = gate_up.shape[-1] if gate_up.dim() else 0
    if (code is None or gate_up.device.type != "cpu" or width % 2 or gate_up.numel() == 0
            or gate_up.stride(-1) != 1):
        return None
    rows = gate_up.reshape(-1, width)  # (M, 2I), a view when the rows are evenly spaced
    kernel = _silu_kernel()
    if kernel is None or rows.stride(1) != 1:
        return None
    half = width // 2
    out = torch.empty(*gate_up.shape[:-1], half, dtype=gate_up.dtype)  # (..., I)
    status = kernel(code, rows.data_ptr(), rows.stride(0), out.data_ptr(), rows.shape[0], half,
                    torch.get_num_threads())
    if status:
        raise RuntimeError(f"silu_mul_rows kernel failed with status {status}")
    return out


def available() -> bool:
    """Whether the kernel is built and loaded here (builds it on first call)."""
    return _kernel() is not None


def scratch_elements(rows: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                     intermediate: int) -> int:
    """Elements of the kernel's scratch for ``rows`` decoding rows (pure function): the
    normed input, q/k/v, rotated q and k, attention output, a product output, gate/up and the
    activation."""
    qkv = (heads + 2 * kv_heads) * head_dim
    return rows * (2 * hidden + qkv + 2 * heads * head_dim + kv_heads * head_dim
                   + 3 * intermediate)


def run_stack(layers: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
              *, heads: int, kv_heads: int, head_dim: int, intermediate: int,
              num_blocks: int, block_size: int, split_keys: int, scratch: torch.Tensor,
              cache_dtype: torch.dtype | None = None) -> None:
    """Run every layer of ``layers`` (a ctypes array of :class:`DecodeLayer`) on ``hidden``.

    Args:
        hidden: ``(M, D)`` float32 or bfloat16, contiguous; updated in place to the last
            layer's output.
        cos, sin: ``(M, Dh)`` rotary tables of the rows, contiguous, ``hidden``'s dtype.
        slot_mapping: ``(M,)`` int64 cache slot of each row's token.
        block_tables: ``(M, W)`` int32, each row's blocks.
        seq_lens: ``(M,)`` int64 context lengths (the new token included).
        scratch: At least :func:`scratch_elements` elements of ``hidden``'s dtype.
        cache_dtype: The layers' KV cache dtype: ``hidden``'s (the default), or float16 under
            float32 (code 2: keys and values stored and read as float16).

    Raises:
        ValueError: A tensor of the wrong dtype, shape or layout, or a slot or block id
            outside the cache.
        RuntimeError: The kernel is not built here, or failed.
    """
    import torch

    kernel = _kernel()
    if kernel is None:
        raise RuntimeError(f"decode_stack kernel: {build.load(KERNEL).reason}")
    dtype = hidden.dtype
    rows, size = hidden.shape
    code = DTYPE_CODES.get(str(dtype).removeprefix("torch."))
    if cache_dtype not in (None, dtype):
        code = 2 if (dtype, cache_dtype) == (torch.float32, torch.float16) else None
    need = scratch_elements(rows, size, heads, kv_heads, head_dim, intermediate)
    if (code is None or not hidden.is_contiguous() or cos.shape != (rows, head_dim)
            or sin.shape != (rows, head_dim) or cos.dtype != dtype or sin.dtype != dtype
            or not cos.is_contiguous() or not sin.is_contiguous()
            or slot_mapping.dtype != torch.int64 or slot_mapping.shape != (rows,)
            or block_tables.dtype != torch.int32 or block_tables.dim() != 2
            or block_tables.shape[0] != rows or block_tables.stride(1) != 1
            or seq_lens.dtype != torch.int64 or seq_lens.shape != (rows,)
            or not slot_mapping.is_contiguous() or not seq_lens.is_contiguous()
            or scratch.dtype != dtype or scratch.numel() < need):
        raise ValueError(f"decode_stack: unexpected step tensors (hidden {tuple(hidden.shape)} "
                         f"{dtype}, cos {tuple(cos.shape)}, tables {tuple(block_tables.shape)} "
                         f"{block_tables.dtype}, scratch {scratch.numel()} of {need})")
    status = kernel(code, layers, len(layers), hidden.data_ptr(), cos.data_ptr(),
                    sin.data_ptr(), slot_mapping.data_ptr(), block_tables.data_ptr(),
                    block_tables.stride(0), seq_lens.data_ptr(), rows, size, heads, kv_heads,
                    head_dim, intermediate, num_blocks, block_size, split_keys,
                    scratch.data_ptr(), torch.get_num_threads())
    if status == 0:
        return
    layer, op, code = status // 100 - 1, status // 10 % 10, status % 10
    where = f"layer {layer}, kernel call {op}" if layer >= 0 else "arguments"
    if code == 3:
        raise ValueError(f"decode_stack: a slot or block id is outside the cache ({where})")
    raise RuntimeError(f"decode_stack kernel failed with status {code} ({where})")
