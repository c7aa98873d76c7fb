"""The packed per-layer weights of the native decode stack, and the one call that runs them.

:class:`PackedLayers` holds, for every layer of an owned Llama-style model
(``engine.cpu.models.llama``), the record ``native.stack_kernel`` reads (pointers to the
norms, the products' tiles or GGUF blocks, the biases, Qwen3's head norms, the layer's paged
cache) and runs all layers of a step on the hidden rows in ONE native call: a pure-decode
step, or a step that is one prefill segment (a chat turn, an agent's tool result: its tokens
as the rows of the one-row decodes at their positions, as the CPU backend attends them). The
owned model builds and calls it, and owns the rest of the step (embedding, rotary tables,
final norm, LM head) and which steps it takes.

The stack reads the same tiles, norms and caches as the model's per-op path
(``engine.cpu.models.ops``) and runs the same kernels, so its values are the per-op path's up
to the SiLU's exponential and, for one float32 row, the order of the product's sums
(``decode_stack.c``); tests compare the two.

Products whose layers are ``quant.linear.QuantizedLinear`` (fused q/k/v and gate/up groups
included, ``engine.cpu.fused_projections``) run in the stack from their GGUF blocks with the
kernel the per-op path calls (``native.qmatmul``, float32 bias, a bf16 model rounding the
product once), so such a product's values are the per-op path's bit for bit; a layer may mix
quantized and float products, and a fused product may be parts in different block formats
(``quantized_layout.QuantizedParts``: one kernel call per part into the same output rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_ascend.engine.cpu.quantized_layout import QuantizedParts, is_quantized_linear
from langchain_ascend.native import paged_attention, qmatmul, stack_kernel

QUANTIZED_MAX_ROWS = 1 << 20
"""Row limit of a quantized product in the stack: none of its own (``native.qmatmul`` takes
any number of rows); the stack's scratch bounds them (:data:`SCRATCH_BYTES`)."""
SCRATCH_BYTES = 32 << 20
"""The most scratch a step's rows may take in the stack (``stack_kernel.scratch_elements``):
so it takes a lone prefill of up to ~1,040 rows at SmolLM2's shape, 225 at Llama-3.2-1B's,
123 at an 8B's, where the gate/up rows still fit the last-level cache as the per-op MLP's
chunks do."""


def _tiles(linear: Any, dtype: Any) -> Any:
    """The ``(N/8, K, 8)`` tiles copy the native products read for ``linear``, or None."""
    import torch

    return getattr(linear, "bf16_tiles" if dtype == torch.bfloat16 else "f32_tiles", None)


def _product(linear: Any, dtype: Any) -> tuple[Any, Any, int, int, list[Any]] | None:
    """``(weight, bias, kind code, row limit, tensors to keep)`` of one product as the stack
    reads it: a quantized linear's blocks with a float32 copy of its bias
    (``stack_kernel.product_code`` of its format and layout), quantized parts' table
    (``stack_kernel.parts_table``, code ``PRODUCT_PARTS``), or a float linear's tiles copy with
    its own bias (code 0); None where the stack cannot take it."""
    import torch

    if isinstance(linear, QuantizedParts):
        found = [_product(part, dtype) for part in linear.parts]
        if any(part is None or part[2] == 0 for part in found):
            return None
        rows = [part.out_features for part in linear.parts]
        table = stack_kernel.parts_table([
            (code, n, blocks.data_ptr(), 0 if bias is None else bias.data_ptr())
            for (blocks, bias, code, _, _), n in zip(found, rows, strict=True)])
        keep = [t for part in found if part is not None for t in part[:2] if t is not None]
        return table, None, stack_kernel.PRODUCT_PARTS, QUANTIZED_MAX_ROWS, keep
    if is_quantized_linear(linear):
        qweight = linear.qweight
        blocks = qweight.blocks
        if blocks.device.type != "cpu" or not blocks.is_contiguous():
            return None
        bias = None if linear.bias is None else linear.bias.detach().to(
            torch.float32).contiguous()  # (N,)
        code = stack_kernel.product_code(qweight.fmt, qweight.layout)
        return blocks, bias, code, QUANTIZED_MAX_ROWS, []
    tiles = _tiles(linear, dtype)
    if tiles is None:
        return None
    return tiles, linear.bias, 0, int(getattr(linear, "native_max_rows", 0)), []


def _ptr(tensor: Any) -> int | None:
    return None if tensor is None else tensor.data_ptr()


@dataclass
class PackedLayers:
    """The native stack of one model: its layers' kernel records and the step rule.

    Attributes:
        dtype: The model's dtype (float32 or bfloat16).
        layers: One :class:`~langchain_ascend.native.stack_kernel.DecodeLayer` per layer
            (cache pointers filled on the first step, from the step's caches).
        indices: Each record's layer index (its paged cache).
        max_rows: Most rows of a step (every product's native row limit, and the rows whose
            scratch fits :data:`SCRATCH_BYTES`).
        geometry: ``(heads, kv_heads, head_dim, intermediate)``.
        keep: The tensors the records point at (kept alive here).
    """

    dtype: Any
    layers: Any
    indices: list[int]
    max_rows: int
    geometry: tuple[int, int, int, int]
    keep: list[Any] = field(default_factory=list)
    _caches: Any = None
    _scratch: Any = None

    @classmethod
    def for_layers(cls, layers: list[Any], *, dtype: Any, geometry: tuple[int, int, int, int],
                   scale: float) -> PackedLayers | None:
        """The packed stack of ``layers`` (an owned model's
        :class:`~langchain_ascend.engine.cpu.models.llama.LlamaLayer` records, in order) of
        ``geometry`` ``(heads, kv_heads, head_dim, intermediate)``, or None where it does not
        apply (no layers, a float product without tiles, a dtype or the kernel not built
        here)."""
        import torch

        if not layers or not stack_kernel.available():
            return None
        if dtype not in (torch.float32, torch.bfloat16):
            return None
        variant = qmatmul.VARIANTS.index(qmatmul.kernel_variant())
        records: list[Any] = []
        keep: list[Any] = []
        max_rows = None
        for layer in layers:
            found = [_product(linear, dtype) for linear in (layer.qkv, layer.o, layer.gate_up,
                                                             layer.down)]
            if any(product is None for product in found):
                return None
            products = [product for product in found if product is not None]
            limit = min(product[3] for product in products)
            max_rows = limit if max_rows is None else min(max_rows, limit)
            (qkv_w, qkv_b, qkv_code, *_), (o_w, o_b, o_code, *_) = products[0], products[1]
            (gu_w, gu_b, gu_code, *_), (down_w, down_b, down_code, *_) = products[2], products[3]
            record = stack_kernel.DecodeLayer(
                norm1=_ptr(layer.input_norm), norm2=_ptr(layer.post_attention_norm),
                qkv_tiles=_ptr(qkv_w), qkv_bias=_ptr(qkv_b),
                q_norm=_ptr(layer.q_norm), k_norm=_ptr(layer.k_norm),
                o_tiles=_ptr(o_w), o_bias=_ptr(o_b),
                gu_tiles=_ptr(gu_w), gu_bias=_ptr(gu_b),
                down_tiles=_ptr(down_w), down_bias=_ptr(down_b), kv_cache=None,
                eps1=layer.eps, eps2=layer.post_eps, head_eps=layer.head_eps,
                scale=scale, window=layer.window or 0,
                qkv_fmt=qkv_code, o_fmt=o_code, gu_fmt=gu_code, down_fmt=down_code,
                q_variant=variant)
            records.append(record)
            keep.extend(tensor for product in products for tensor in product[:2]
                        if tensor is not None)
            keep.extend(tensor for product in products for tensor in product[4])
        heads, kv_heads, head_dim, intermediate = geometry
        row_bytes = dtype.itemsize * stack_kernel.scratch_elements(
            1, layers[0].input_norm.numel(), heads, kv_heads, head_dim, intermediate)
        max_rows = min(max_rows or 0, SCRATCH_BYTES // row_bytes)
        array = (stack_kernel.DecodeLayer * len(records))(*records)
        return cls(dtype=dtype, layers=array, indices=[layer.index for layer in layers],
                   max_rows=max_rows, geometry=geometry, keep=keep)

    def step_tables(self, step: Any, input_ids: Any) -> tuple[Any, Any] | None:
        """The attention tables (:meth:`attention_rows`) of a step the stack runs, for
        :meth:`run`, or None where it does not take this call (``input_ids`` ``(1, T)``): the
        CPU backend's paged path for at most :attr:`max_rows` rows, every row a decode
        (shared prefixes and verify passes included) or all of them one prefill segment."""
        metadata = getattr(step, "metadata", None)
        if (metadata is None or input_ids is None or input_ids.dim() != 2
                or input_ids.shape[0] != 1 or not 0 < input_ids.shape[1] <= self.max_rows):
            return None
        return self.attention_rows(metadata, input_ids.shape[1])

    def attention_rows(self, metadata: Any, rows: int) -> tuple[Any, Any] | None:
        """``(block_tables (T, W) int32, seq_lens (T,) int64)`` the stack attends ``rows``
        rows with, or None where it does not take the step: the decodes' own tables, or a
        step that is one prefill segment as the CPU backend runs its tokens (each the one-row
        decode at its position, one table row for all: stride 0; the same kernel, so the
        same bits) while their attention state fits ``paged_attention.STATE_BYTES``."""
        decodes = getattr(metadata, "decodes", None)
        prefills = getattr(metadata, "prefills", None)
        if not prefills:
            paged = getattr(decodes, "paged", None)
            return paged if paged is not None and decodes.num_decodes == rows else None
        calls = getattr(metadata, "prefill_calls", None)
        if (decodes is not None and decodes.num_decodes) or not calls or len(prefills) != 1:
            return None
        seg, (seq_lens, block_tables) = prefills[0], calls[0]
        if (seg.start, seg.end) != (0, rows):
            return None
        heads, _, head_dim, _ = self.geometry
        splits = -(-int(seq_lens[-1]) // paged_attention.SPLIT_KEYS)
        if rows * heads * splits * (head_dim + 2) * 4 > paged_attention.STATE_BYTES:
            return None
        return block_tables, seq_lens

    def run(self, hidden: Any, cos: Any, sin: Any, step: Any, tables: tuple[Any, Any]) -> None:
        """Every layer on ``hidden`` ``(M, D)`` in place, writing the step's K/V; ``tables``:
        the step's :meth:`step_tables`."""
        import torch

        caches = step.kv_caches
        if self._caches is not caches:  # the runner's caches: fixed for its lifetime
            for record, index in zip(self.layers, self.indices, strict=True):
                record.kv_cache = caches[index].data_ptr()
            self._caches = caches
        rows, size = hidden.shape
        heads, kv_heads, head_dim, intermediate = self.geometry
        need = stack_kernel.scratch_elements(rows, size, heads, kv_heads, head_dim,
                                             intermediate)
        if self._scratch is None or self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=self.dtype)
        block_tables, seq_lens = tables
        cache = caches[0]  # (2, KVH, NB, BS, Dh), the same shape for every layer
        stack_kernel.run_stack(
            self.layers, hidden, cos, sin, step.metadata.slot_mapping, block_tables, seq_lens,
            heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
            num_blocks=cache.shape[2], block_size=cache.shape[3],
            split_keys=paged_attention.SPLIT_KEYS,
            scratch=self._scratch, cache_dtype=cache.dtype)
