"""Ascend NPU paged attention through torch_npu's fused inference kernel.

UNTESTED ON HARDWARE: written from the torch_npu / op-plugin documentation and from how
vllm-ascend calls these kernels (no NPU was available). The CPU test suite only checks that
this module imports without torch_npu and refuses cleanly when it is missing.

One call per layer covers the whole packed batch (decodes, fresh prefills and prefill chunks
after a cached prefix):

* cache write: ``torch_npu._npu_reshape_and_cache`` (910B, ATB op) or
  ``torch_npu.npu_scatter_pa_kv_cache`` where present, else a plain ``index_copy_``;
* attention: ``torch_npu.npu_fused_infer_attention_score`` with ``input_layout="TND"`` (packed
  tokens), ``block_table`` (int32 ``[segments, max_blocks]``), ``actual_seq_lengths`` =
  CUMULATIVE query ends, ``actual_seq_lengths_kv`` = per-segment context lengths,
  ``sparse_mode=3`` with the 2048x2048 upper-triangular bool mask (causal aligned to the end
  of each segment's keys, which is exactly "prefix + causal over the new tokens").

Cache layout per layer: ``(2, num_blocks, block_size, kv_heads, head_dim)``; ``[0]`` and ``[1]``
are the ``[num_blocks, block_size, kv_heads, head_dim]`` key / value caches, viewed as
``[num_blocks, block_size, kv_heads * head_dim]`` for the kernel. Block sizes must be a multiple
of 128 (the prefill kernel's paged mode requires it).

``torch_npu`` is imported only inside this module's functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_ascend.attention.backends.base import AttentionBackend, BatchLayout, num_blocks_for
from langchain_ascend.errors import UnsupportedModelFeatureError
from langchain_ascend.platform import import_torch_npu

if TYPE_CHECKING:
    import torch

_MASK_SIZE = 2048  # sparse_mode=3 takes a fixed 2048 x 2048 causal mask


@dataclass
class NPUMetadata:
    """Per-step tensors and host lists for the fused kernel (shared by all layers)."""

    slot_mapping: torch.Tensor  # (T,) int32
    block_tables: torch.Tensor  # (S, max_blocks) int32
    query_ends: list[int]  # cumulative query lengths without the leading 0
    seq_lens: list[int]
    block_size: int
    causal_mask: torch.Tensor  # (2048, 2048) bool, True above the diagonal


class NPUBackend(AttentionBackend):
    """torch_npu fused paged attention (TND layout). Untested on hardware."""

    name: ClassVar[str] = "npu"
    supports_softcap: ClassVar[bool] = False  # the fused kernel has no logit soft-cap

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._torch_npu = import_torch_npu("the NPU attention backend")
        import torch

        self._causal_mask = torch.triu(
            torch.ones(_MASK_SIZE, _MASK_SIZE, dtype=torch.bool, device=self.device), diagonal=1)
        self._writer = self._pick_cache_writer()

    @classmethod
    def preferred_block_size(cls) -> int:
        return 128

    @classmethod
    def check_block_size(cls, block_size: int) -> None:
        super().check_block_size(block_size)
        if block_size % 128 or not 128 <= block_size <= 512:
            raise ValueError(f"the NPU paged attention kernel needs a block size that is a "
                             f"multiple of 128 in [128, 512], got {block_size}")

    def build_metadata(self, layout: BatchLayout) -> NPUMetadata:
        import torch

        width = max(num_blocks_for(n, layout.block_size) for n in layout.seq_lens)
        rows = [table[:width] + [0] * (width - min(width, len(table)))
                for table in layout.block_tables]
        return NPUMetadata(
            slot_mapping=torch.tensor(layout.slot_mapping, dtype=torch.int32).to(
                self.device, non_blocking=True),
            block_tables=torch.tensor(rows, dtype=torch.int32).to(self.device, non_blocking=True),
            query_ends=layout.query_start_loc[1:],
            seq_lens=list(layout.seq_lens),
            block_size=layout.block_size,
            causal_mask=self._causal_mask,
        )

    def _pick_cache_writer(self):
        npu = self._torch_npu
        if hasattr(npu, "_npu_reshape_and_cache"):
            return lambda k, v, kc, vc, slots: npu._npu_reshape_and_cache(k, v, kc, vc, slots)
        if hasattr(npu, "npu_scatter_pa_kv_cache"):
            return lambda k, v, kc, vc, slots: npu.npu_scatter_pa_kv_cache(k, v, kc, vc, slots)

        def index_copy_writer(k, v, kc, vc, slots):
            flat = (-1, self.num_kv_heads, self.head_dim)
            kc.view(flat).index_copy_(0, slots.long(), k)
            vc.view(flat).index_copy_(0, slots.long(), v)

        return index_copy_writer

    def forward(self, query, key, value, kv_cache, metadata: NPUMetadata, scale: float,
                sliding_window: int | None = None, softcap: float | None = None):
        if softcap:  # the runner refuses such a model at start; a direct caller gets this
            raise UnsupportedModelFeatureError(
                f"the npu attention backend has no attention logit soft-capping (softcap="
                f"{softcap}): use attention_backend='torch_ref'")
        if sliding_window is not None and max(metadata.seq_lens) > sliding_window:
            raise NotImplementedError("sliding-window attention is not wired for the NPU backend")
        key_cache, value_cache = kv_cache[0], kv_cache[1]  # (nb, bs, KVH, D) each
        self._writer(key.contiguous(), value.contiguous(), key_cache, value_cache,
                     metadata.slot_mapping)
        num_blocks, block_size = key_cache.shape[:2]
        out, _ = self._torch_npu.npu_fused_infer_attention_score(
            query.contiguous(),  # (T, H, D)
            key_cache.view(num_blocks, block_size, -1),  # (nb, bs, KVH*D)
            value_cache.view(num_blocks, block_size, -1),
            atten_mask=metadata.causal_mask,
            block_table=metadata.block_tables,
            input_layout="TND",
            block_size=block_size,
            actual_seq_lengths=metadata.query_ends,
            actual_seq_lengths_kv=metadata.seq_lens,
            num_key_value_heads=self.num_kv_heads,
            num_heads=self.num_heads,
            scale=scale,
            sparse_mode=3,
        )
        return out.view(-1, self.num_heads, self.head_dim)  # (T, H, D)
