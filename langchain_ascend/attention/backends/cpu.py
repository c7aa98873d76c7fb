"""The CPU backend: torch_ref's cache layout, metadata and paths, with attention done by the
native paged kernel (``langchain_ascend.native.paged_attention``).

A decode step on CPU streams every cached key and value once per layer; torch's CPU
flash-attention op does that at about a third of the memory rate for the few query rows a
decode has (the grouped query heads of each request). The paged kernel
(``native.paged_attention``) replaces it for every decode step: each decoding request attends
its own blocks through its row of an int32 block table, all requests in one call per layer --
no gather, no per-request Python, sliding windows included, float32 and bfloat16. Decodes
sharing a cached prefix (an agent's system prompt, a speculative verify pass's rows) read the
shared blocks once for all of them inside that kernel, and every row is computed exactly as
alone: a request's text does not depend on what it was batched with.

Prefill segments of a float32 model (over a float32 or float16 cache) run the same kernel:
each new token is the one-row decode at its position (its context length, its segment's
block table), a call per segment. The segment's rows share one table, so the kernel makes
rows from the same first key one work item, which reads those keys once for all of them (a
row that ends sooner sees its own keys only) -- the agent's turn after a tool call, whose few
hundred new tokens attend a cached system prompt of thousands. One kernel for both is what
makes a token's keys and values the same bits whether it was prefilled or decoded: a hop's
output kept in the cache (retention, prefix caching) and the same text recomputed after an
eviction give the same next tokens.

The kernel takes Gemma 2's logit soft-cap (``softcap``). Where it is not built here,
torch_ref's decode paths run; everything else -- bfloat16 prefills, hosts where no kernel
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
    PrefillSegment,
    TorchRefBackend,
    TorchRefMetadata,
    decode_tables,
)
from langchain_ascend.native import paged_attention

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def padded_tables(tables: list[list[int]]) -> torch.Tensor:
    """``(len(tables), W)`` int32 of ragged block lists, each padded to the longest with its
    first id (a valid block the kernels never read past a row's length)."""
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [t[0]] * (width - len(t)) for t in tables], dtype=torch.int32)


def prefill_rows(layout: BatchLayout, prefills: list[PrefillSegment],
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per prefill segment, its tokens as one-row decodes: ``(seq_lens (n,) int64,
    block_tables (n, W) int32)`` -- each token's context length (itself included) and the
    segment's blocks, one table row for all of them (stride 0: the kernel then knows its rows
    read the same slots as far as each goes)."""
    import torch

    first, calls = layout.num_decodes, []
    for index, seg in enumerate(prefills):
        table = layout.block_tables[first + index][: num_blocks_for(seg.seq_len,
                                                                    layout.block_size)]
        lens = torch.arange(seg.context_len + 1, seg.seq_len + 1, dtype=torch.int64)  # (n,)
        row = torch.tensor(table, dtype=torch.int32)  # (W,)
        calls.append((lens, row[None, :].expand(len(lens), -1)))  # (n,), (n, W)
    return calls


@dataclass
class CPUMetadata(TorchRefMetadata):
    """torch_ref's step metadata plus the paged kernel's view of the prefill segments
    (:func:`prefill_rows`).

    Attributes:
        prefill_calls: Per prefill segment, ``(seq_lens (n,), block_tables (n, W))``.
    """

    prefill_calls: list[tuple[torch.Tensor, torch.Tensor]] | None = None


class CPUBackend(TorchRefBackend):
    """torch_ref with the native decode-attention kernels where they apply.

    Attributes:
        paged_native: Whether the paged kernel runs every decode (float32 or bfloat16 on CPU,
            built here, head size a multiple of 8).
        prefill_native: Whether the paged kernel also runs every prefill token (a float32
            model with the paged kernel).
    """

    name: ClassVar[str] = "cpu"

    def __init__(self, **kwargs) -> None:
        import torch

        super().__init__(**kwargs)
        on_cpu = self.device.type == "cpu" and self.head_dim % 8 == 0
        self.paged_native = (on_cpu and self.dtype in (torch.float32, torch.bfloat16)
                             and paged_attention.available(self.dtype, self.cache_dtype))
        self.prefill_native = self.paged_native and self.dtype == torch.float32
        if not self.paged_native:
            logger.info("cpu attention backend without the paged kernel (%s)",
                        paged_attention.unavailable_reason() if on_cpu
                        else f"{self.dtype} on {self.device}, head size {self.head_dim}")

    def supports_cache_dtype(self, cache_dtype) -> bool:
        """The model's dtype, or float16 under a float32 model where the paged kernel reads it
        (every decode and prefill token then runs that kernel, widening each key and value
        as it reads it)."""
        import torch

        return cache_dtype == self.dtype or (
            self.device.type == "cpu" and self.head_dim % 8 == 0
            and self.dtype == torch.float32 and cache_dtype == torch.float16
            and paged_attention.available(self.dtype, cache_dtype))

    def build_metadata(self, layout: BatchLayout) -> TorchRefMetadata:
        """torch_ref's metadata; where the paged kernel runs prefills, a
        :class:`CPUMetadata` that also holds the prefill tokens' lengths and tables."""
        metadata = super().build_metadata(layout)
        if not (self.prefill_native and metadata.prefills):
            return metadata
        return CPUMetadata(metadata.slot_mapping, metadata.decodes, metadata.prefills,
                           prefill_calls=prefill_rows(layout, metadata.prefills))

    def _prefills(self, query, key, value, kv_cache, metadata, scale, window, softcap=None):
        """Every prefill token of the step through the paged kernel, each as the one-row
        decode at its position, a call per segment (where the kernel applies)."""
        if isinstance(metadata, CPUMetadata):
            outs = []
            for seg, (lens, tables) in zip(metadata.prefills, metadata.prefill_calls,
                                           strict=True):
                out = paged_attention.paged_decode(query[seg.start:seg.end], kv_cache, tables,
                                                   lens, scale, window or 0, softcap or 0.0)
                if out is None:
                    break
                outs.append(out)  # (n, H, D)
            else:
                return outs
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
