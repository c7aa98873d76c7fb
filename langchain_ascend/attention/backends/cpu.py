"""The CPU backend: torch_ref's cache layout, metadata and paths, with decode attention done
by native kernels (``langchain_ascend.native``).

A decode step on CPU streams every cached key and value once per layer; torch's CPU
flash-attention op does that at about a third of the memory rate for the few query rows a
decode has (the grouped query heads of each request). The paged kernel
(``native.paged_attention``) replaces it for every decode step: each decoding request attends
its own blocks through its row of an int32 block table, all requests in one call per layer --
no gather, no per-request Python, sliding windows included, float32 and bfloat16. Decodes
sharing a cached prefix (an agent's system prompt, a speculative verify pass's rows) read the
shared blocks once for all of them inside that kernel, and every row is computed exactly as
alone: a request's text does not depend on what it was batched with.

Prefill segments of a float32 model (over a float32 or float16 cache) run the prefill
kernel (``native.prefill_attention``): each segment's new tokens attend their cached prefix
and each other straight from the pages, no gather, blocked like a GEMM -- the agent's turn
after a tool call, whose few hundred new tokens attend a cached system prompt of thousands.

Both kernels take Gemma 2's logit soft-cap (``softcap``). Where the paged kernel is not built
here, torch_ref's decode paths run; everything else -- bfloat16 prefills, hosts where no kernel
can be built -- runs torch_ref's code unchanged, so this backend is correct wherever torch_ref
is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from langchain_ascend.attention.backends.base import BatchLayout, num_blocks_for
from langchain_ascend.attention.backends.torch_ref import (
    DecodeGroup,
    TorchRefBackend,
    TorchRefMetadata,
    decode_tables,
)
from langchain_ascend.native import paged_attention, prefill_attention

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def padded_tables(tables: list[list[int]]) -> torch.Tensor:
    """``(len(tables), W)`` int32 of ragged block lists, each padded to the longest with its
    first id (a valid block the kernels never read past a row's length)."""
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32)


@dataclass
class CPUMetadata(TorchRefMetadata):
    """torch_ref's step metadata plus what the prefill kernel reads.

    Attributes:
        prefill_rows: ``(S, 3)`` int64: each prefill segment's first row among the step's
            prefill tokens, its new tokens, its context length.
        prefill_tables: ``(S, W)`` int32 blocks covering each segment's whole sequence.
    """

    prefill_rows: torch.Tensor | None = None
    prefill_tables: torch.Tensor | None = None


class CPUBackend(TorchRefBackend):
    """torch_ref with the native decode-attention kernels where they apply.

    Attributes:
        paged_native: Whether the paged kernel runs every decode (float32 or bfloat16 on CPU,
            built here, head size a multiple of 8).
        prefill_native: Whether the prefill kernel runs every prefill segment (float32 on CPU
            over a float32 or float16 cache, built here, head size a multiple of 8 up to 256).
    """

    name: ClassVar[str] = "cpu"

    def __init__(self, **kwargs) -> None:
        import torch

        super().__init__(**kwargs)
        on_cpu = self.device.type == "cpu" and self.head_dim % 8 == 0
        self.paged_native = (on_cpu and self.dtype in (torch.float32, torch.bfloat16)
                             and paged_attention.available(self.dtype, self.cache_dtype))
        self.prefill_native = (on_cpu and self.dtype == torch.float32
                               and self.head_dim <= prefill_attention.MAX_HEAD_DIM
                               and prefill_attention.available(self.cache_dtype))
        if not self.paged_native:
            logger.info("cpu attention backend without the paged kernel (%s)",
                        paged_attention.unavailable_reason() if on_cpu
                        else f"{self.dtype} on {self.device}, head size {self.head_dim}")

    def supports_cache_dtype(self, cache_dtype) -> bool:
        """The model's dtype, or float16 under a float32 model where the paged kernel reads it
        (every decode then runs that kernel; prefills widen the keys and values they read)."""
        import torch

        return cache_dtype == self.dtype or (
            self.device.type == "cpu" and self.head_dim % 8 == 0
            and self.dtype == torch.float32 and cache_dtype == torch.float16
            and paged_attention.available(self.dtype, cache_dtype))

    def build_metadata(self, layout: BatchLayout) -> TorchRefMetadata:
        """torch_ref's metadata; with the prefill kernel, a :class:`CPUMetadata` that also
        holds the prefill segments' rows and block tables for it."""
        import torch

        metadata = super().build_metadata(layout)
        if not (self.prefill_native and metadata.prefills):
            return metadata
        first = layout.num_decodes
        base = metadata.prefills[0].start
        rows = [(seg.start - base, seg.end - seg.start, seg.context_len)
                for seg in metadata.prefills]
        tables = [layout.block_tables[first + index][: num_blocks_for(seg.seq_len,
                                                                      layout.block_size)]
                  for index, seg in enumerate(metadata.prefills)]
        return CPUMetadata(metadata.slot_mapping, metadata.decodes, metadata.prefills,
                           prefill_rows=torch.tensor(rows, dtype=torch.int64),  # (S, 3)
                           prefill_tables=padded_tables(tables))  # (S, W)

    def _prefills(self, query, key, value, kv_cache, metadata, scale, window, softcap=None):
        """Every prefill segment in one call of the prefill kernel (where it applies)."""
        if isinstance(metadata, CPUMetadata):
            start, end = metadata.prefills[0].start, metadata.prefills[-1].end
            out = prefill_attention.prefill_segments(
                query[start:end], kv_cache, metadata.prefill_rows, metadata.prefill_tables,
                scale, window or 0, softcap or 0.0)
            if out is not None:
                return [out]  # (n_1 + ... + n_S, H, D)
        return super()._prefills(query, key, value, kv_cache, metadata, scale, window, softcap)

    def _decode_group(self, layout: BatchLayout) -> DecodeGroup:
        """The paged path for every decode step (torch_ref's without the paged kernel)."""
        import torch

        if not self.paged_native:
            return super()._decode_group(layout)
        seq_lens, tables = decode_tables(layout)
        block_tables = padded_tables(tables)  # (B, W)
        lens = torch.tensor(seq_lens, dtype=torch.long)  # (B,)
        return DecodeGroup(len(tables), seq_lens, None, None, None,
                           paged=(block_tables, lens))

    def _decode(self, query, kv_cache, group: DecodeGroup, scale, window, softcap=None):
        if group.paged is None:
            return super()._decode(query, kv_cache, group, scale, window, softcap)
        block_tables, lens = group.paged
        out = paged_attention.paged_decode(query, kv_cache, block_tables, lens, scale,
                                           window or 0, softcap or 0.0)
        if out is None:  # not expected: the dtype and head size were checked at start
            raise RuntimeError("paged decode attention kernel does not apply to this cache")
        return out
