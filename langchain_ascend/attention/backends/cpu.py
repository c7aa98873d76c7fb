"""The CPU backend: torch_ref's cache layout, metadata and paths, with the decode attention
over cached runs of blocks done by the native kernel (``langchain_ascend.native``).

A decode step on CPU streams every cached key and value once per layer; torch's CPU
flash-attention op does that at about a third of the memory rate for the few query rows a
decode has (the grouped query heads of each request). The native kernel streams each run once
per KV head with all its query rows, and returns the log-sum-exp the piecewise path merges
by. Everything else -- prefills, the gather path, bfloat16, hosts where the kernel cannot be
built -- runs torch_ref's code unchanged, so this backend is correct wherever torch_ref is.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
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

    def _native(self, q, keys, values, bias, scale):
        """``(out (1, KVH, R, D), lse (1, KVH, R))`` from the kernel, or None."""
        if not self.native:
            return None
        result = decode_attention.attend(q[0], keys, values, bias, scale)
        if result is None:
            return None
        out, lse = result
        return out[None], lse[None]
