"""The CPU backend: torch_ref's cache layout, metadata and paths, with the decode attention
over cached runs of blocks done by the native kernel (``langchain_ascend.native``).

A decode step on CPU streams every cached key and value once per layer; torch's CPU
flash-attention op does that at about a third of the memory rate for the few query rows a
decode has (the grouped query heads of each request). The native kernel streams each run once
per KV head with all its query rows, and returns the log-sum-exp the piecewise path merges
by. Decodes over unrelated contexts (torch_ref's padded gather of every request's pages) are
attended request by request instead, each over a view of its blocks when they are one run.
Everything else -- prefills, sliding windows past their width, bfloat16, hosts where the
kernel cannot be built -- runs torch_ref's code unchanged, so this backend is correct wherever
torch_ref is.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from langchain_ascend.attention.backends.torch_ref import TorchRefBackend, consecutive_runs
from langchain_ascend.native import decode_attention

logger = logging.getLogger(__name__)


class CPUBackend(TorchRefBackend):
    """torch_ref with the native decode-attention kernel where it applies.

    Attributes:
        native: Whether this instance calls the kernel (float32 on CPU, kernel built here,
            head size a multiple of 8).
    """

    name: ClassVar[str] = "cpu"

    def __init__(self, **kwargs) -> None:
        import torch

        super().__init__(**kwargs)
        self.native = (self.device.type == "cpu" and self.dtype == torch.float32
                       and self.head_dim % 8 == 0 and decode_attention.available())
        if not self.native:
            logger.info("cpu attention backend without the native kernel (%s)",
                        decode_attention.unavailable_reason()
                        if self.device.type == "cpu" and self.dtype == torch.float32
                        else f"{self.dtype} on {self.device}")

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

    def _decode_gathered(self, query, kv_cache, group, scale, window):
        """Unrelated contexts: each request attended over its own blocks by the kernel (a view
        when they are one run, else its pages gathered), instead of one padded gather of all."""
        import torch

        if (not self.native or group.tables is None
                or (window is not None and max(group.seq_lens) > window)):
            return super()._decode_gathered(query, kv_cache, group, scale, window)
        kv_heads, size, dim = self.num_kv_heads, self.group, self.head_dim
        slots = kv_cache.view(2, kv_heads, -1, dim)  # (2, KVH, slots, D)
        block_size = kv_cache.shape[3]
        outputs = []
        for b, (table, seq_len) in enumerate(zip(group.tables, group.seq_lens, strict=True)):
            runs = consecutive_runs(table)
            if len(runs) == 1:
                first = runs[0][0] * block_size
                keys, values = slots[:, :, first: first + seq_len]  # (KVH, L, D) each
            else:
                ids = torch.tensor(table, dtype=torch.long, device=self.device)  # (nb,)
                pages = kv_cache.flatten(3).index_select(2, ids)  # (2, KVH, nb, bs*D)
                keys, values = pages.view(2, kv_heads, -1, dim)[:, :, :seq_len]
            result = decode_attention.attend(query[b].view(kv_heads, size, dim), keys, values,
                                             None, scale)  # (KVH, G, D), (KVH, G)
            if result is None:
                return super()._decode_gathered(query, kv_cache, group, scale, window)
            outputs.append(result[0])
        return torch.stack(outputs).view(group.num_decodes, self.num_heads, dim)  # (B, H, D)

    def _native(self, q, keys, values, bias, scale):
        """``(out (1, KVH, R, D), lse (1, KVH, R))`` from the kernel, or None."""
        if not self.native:
            return None
        result = decode_attention.attend(q[0], keys, values, bias, scale)
        if result is None:
            return None
        out, lse = result
        return out[None], lse[None]
