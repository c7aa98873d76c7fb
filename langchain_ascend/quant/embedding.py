"""An embedding table kept in a block format: the looked-up rows are de-quantized on the fly.

A tied LM head and its embedding can share one :class:`QuantizedEmbedding`'s blocks with a
``QuantizedLinear`` head, so the table is held once, quantized (SmolLM2: 28 MB of Q8_0 blocks
instead of 113 MB of float32).

A decode step looks up one row per request, and de-quantizing it through torch's small ops
costs ~65-150 us (a SmolLM2 decode step takes ~5 ms); so the rows of such small lookups are
kept de-quantized in a bounded first-in first-out table (:data:`KEPT_ROWS_BYTES`): text repeats
its tokens, and a kept row is the same values the blocks give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from langchain_ascend.quant import formats

if TYPE_CHECKING:
    from langchain_ascend.quant.formats import QuantizedWeight

KEPT_ROWS_BYTES = 8 << 20
"""The most bytes of de-quantized rows a table keeps (SmolLM2: 3,640 rows of 576 floats)."""
SMALL_LOOKUP = 16
"""Lookups of at most this many ids (decode steps) go through the kept rows; larger ones
(prefills) de-quantize their rows at once and keep none."""


class QuantizedEmbedding(nn.Module):
    """``embedding(ids)`` from a ``(num_embeddings, embedding_dim)`` weight kept as blocks.

    Args:
        qweight: The table, one row per token, in a block format (any layout; kept in the
            file's ``"gguf"`` layout, where a row is looked up by itself).
        dtype: The dtype of the returned rows (the model's).
        padding_idx: Kept for attribute compatibility with ``nn.Embedding``.
        scale: Multiplies every looked-up row (Gemma's ``embed_scale``, ``sqrt(hidden)``,
            applied in the model dtype as its scaled embedding does); None: no scaling.

    Attributes:
        num_embeddings: Rows of the table.
        embedding_dim: Width of a row.
        qweight: The table's :class:`~langchain_ascend.quant.formats.QuantizedWeight`; its
            blocks are this module's non-persistent buffer ``blocks``.
    """

    blocks: torch.Tensor

    def __init__(self, qweight: QuantizedWeight, *, dtype: torch.dtype = torch.float32,
                 padding_idx: int | None = None, scale: float | None = None) -> None:
        super().__init__()
        qweight = formats.to_layout(qweight, "gguf")
        self.num_embeddings = qweight.out_features
        self.embedding_dim = qweight.in_features
        self.padding_idx = padding_idx
        self.fmt = qweight.fmt
        self.dtype = dtype
        self.scale = scale
        self.register_buffer("blocks", qweight.blocks, persistent=False)
        self._qweight = qweight
        self._kept: dict[int, torch.Tensor] = {}  # token id -> (embedding_dim,) row
        self._kept_limit = max(SMALL_LOOKUP, KEPT_ROWS_BYTES // (4 * self.embedding_dim))

    @classmethod
    def replacing(cls, embedding: nn.Module, qweight: QuantizedWeight, *,
                  dtype: torch.dtype) -> QuantizedEmbedding:
        """The block embedding that stands for ``embedding`` (its padding index, and the
        scale of a scaled embedding: transformers' Gemma ones multiply by their
        ``embed_scale``, ``sqrt(hidden)``, in their forward)."""
        scale = getattr(embedding, "embed_scale", None)
        return cls(qweight, dtype=dtype, padding_idx=getattr(embedding, "padding_idx", None),
                   scale=None if scale is None else float(scale))

    @property
    def qweight(self) -> QuantizedWeight:
        blocks = self.blocks
        if self._qweight.blocks is not blocks:
            self._qweight = formats.QuantizedWeight(self.fmt, self.num_embeddings,
                                                    self.embedding_dim, blocks)
        return self._qweight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids (...)`` -> ``(..., embedding_dim)`` in ``self.dtype``."""
        flat = input_ids.reshape(-1)  # (T,)
        if flat.numel() == 0:
            return torch.empty(*input_ids.shape, self.embedding_dim, dtype=self.dtype)
        if flat.numel() <= SMALL_LOOKUP and flat.device.type == "cpu":
            values = self._kept_rows(flat.tolist())  # (T, D)
        else:
            values = self._rows(flat)  # (T, D)
        return values.reshape(*input_ids.shape, self.embedding_dim)

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``(T, D)`` rows of ``ids`` ``(T,)``, de-quantized (and scaled) in ``self.dtype``."""
        rows = self.blocks.index_select(0, ids)  # (T, bytes per row)
        part = formats.QuantizedWeight(self.fmt, int(ids.numel()), self.embedding_dim, rows)
        values = formats.dequantize(part).to(self.dtype)  # (T, D)
        if self.scale is not None:
            values = values * torch.tensor(self.scale, dtype=self.dtype)
        return values

    def _kept_rows(self, ids: list[int]) -> torch.Tensor:
        """``(T, D)`` rows of a small lookup from the kept rows; the missing ones are
        de-quantized together and kept (the oldest kept rows make room)."""
        kept = self._kept
        missing = list(dict.fromkeys(i for i in ids if i not in kept))
        if missing:
            fresh = self._rows(torch.tensor(missing, dtype=torch.long))  # (U, D)
            for token, row in zip(missing, fresh, strict=True):
                while len(kept) >= self._kept_limit:
                    del kept[next(iter(kept))]
                kept[token] = row.clone()  # its own storage: the bound counts every row
        return torch.stack([kept[i] for i in ids])  # (T, D), a new tensor: callers edit it

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, fmt={self.fmt}, "
                f"dtype={self.dtype}" + ("" if self.scale is None else f", scale={self.scale}"))
