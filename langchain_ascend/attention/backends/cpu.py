"""The CPU backend: torch_ref's cache layout, metadata and paths, with decode attention done
by native kernels (``langchain_ascend.native``).

A decode step on CPU streams every cached key and value once per layer; torch's CPU
flash-attention op does that at about a third of the memory rate for the few query rows a
decode has (the grouped query heads of each request). Two kernels replace it:

* paged (``native.paged_attention``): every decoding request attends its own blocks through
  its row of an int32 block table, all requests in one call per layer -- no gather, no
  per-request Python, sliding windows included. Used for a single request and for decodes
  over unrelated contexts, in float32 and bfloat16.
* shared (``native.decode_attention``, float32): decodes sharing a cached prefix attend the
  union of their blocks once per KV head with all their query rows (torch_ref's shared path;
  each shared block read once, not once per request), run by run, merged by log-sum-exp.

Everything else -- prefills, hosts where the kernels cannot be built -- runs torch_ref's code
unchanged, so this backend is correct wherever torch_ref is.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from langchain_ascend.attention.backends.base import BatchLayout
from langchain_ascend.attention.backends.torch_ref import (
    DecodeGroup,
    TorchRefBackend,
    decode_tables,
    union_is_small,
)
from langchain_ascend.native import decode_attention, paged_attention

logger = logging.getLogger(__name__)


def prefers_shared(tables: list[list[int]], seq_lens: list[int], block_size: int) -> bool:
    """Whether several decodes share enough blocks that reading their union once beats each
    request reading its own blocks (torch_ref's rule; pure function)."""
    if len(tables) < 2:
        return False
    return union_is_small(len({block for table in tables for block in table}), seq_lens,
                          block_size)


class CPUBackend(TorchRefBackend):
    """torch_ref with the native decode-attention kernels where they apply.

    Attributes:
        native: Whether the shared-path kernel is used (float32 on CPU, built here, head size
            a multiple of 8).
        paged_native: Whether the paged kernel is used (float32 or bfloat16 on CPU, built
            here, head size a multiple of 8).
    """

    name: ClassVar[str] = "cpu"

    def __init__(self, **kwargs) -> None:
        import torch

        super().__init__(**kwargs)
        on_cpu = self.device.type == "cpu" and self.head_dim % 8 == 0
        self.native = (on_cpu and self.dtype == torch.float32 and decode_attention.available())
        self.paged_native = (on_cpu and self.dtype in (torch.float32, torch.bfloat16)
                             and paged_attention.available(self.dtype))
        if not self.paged_native:
            logger.info("cpu attention backend without the paged kernel (%s)",
                        paged_attention.unavailable_reason() if on_cpu
                        else f"{self.dtype} on {self.device}, head size {self.head_dim}")

    def _decode_group(self, layout: BatchLayout) -> DecodeGroup:
        """The paged path for one request or unrelated contexts; torch_ref's otherwise."""
        import torch

        if not self.paged_native:
            return super()._decode_group(layout)
        seq_lens, tables = decode_tables(layout)
        if self.native and prefers_shared(tables, seq_lens, layout.block_size):
            return super()._decode_group(layout)
        width = max(len(t) for t in tables)
        padded = [t + [t[0]] * (width - len(t)) for t in tables]
        block_tables = torch.tensor(padded, dtype=torch.int32)  # (B, W)
        lens = torch.tensor(seq_lens, dtype=torch.long)  # (B,)
        return DecodeGroup(len(tables), seq_lens, None, None, None,
                           paged=(block_tables, lens))

    def _decode(self, query, kv_cache, group: DecodeGroup, scale, window):
        if group.paged is None:
            return super()._decode(query, kv_cache, group, scale, window)
        block_tables, lens = group.paged
        out = paged_attention.paged_decode(query, kv_cache, block_tables, lens, scale,
                                           window or 0)
        if out is None:  # not expected: the dtype and head size were checked at start
            raise RuntimeError("paged decode attention kernel does not apply to this cache")
        return out

    def _attend_shared(self, q, keys, values, bias, scale):
        result = self._native(q, keys, values, bias, scale)
        if result is None:
            return super()._attend_shared(q, keys, values, bias, scale)
        return result[0]

    def _attend_with_lse(self, q, keys, values, bias, scale):
        result = self._native(q, keys, values, bias, scale)
        if result is None:
            return super()._attend_with_lse(q, keys, values, bias, scale)
        return result

    def _native(self, q, keys, values, bias, scale):
        """``(out (1, KVH, R, D), lse (1, KVH, R))`` from the shared-path kernel, or None."""
        if not self.native:
            return None
        result = decode_attention.attend(q[0], keys, values, bias, scale)
        if result is None:
            return None
        out, lse = result
        return out[None], lse[None]
