"""An embedding table kept in a block format: the looked-up rows are de-quantized on the fly.

A tied LM head and its embedding can share one :class:`QuantizedEmbedding`'s blocks with a
``QuantizedLinear`` head, so the table is held once, quantized (SmolLM2: 28 MB of Q8_0 blocks
instead of 113 MB of float32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from langchain_ascend.quant import formats

if TYPE_CHECKING:
    from langchain_ascend.quant.formats import QuantizedWeight


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
        rows = self.blocks.index_select(0, flat)  # (T, bytes per row)
        part = formats.QuantizedWeight(self.fmt, int(flat.numel()), self.embedding_dim, rows)
        values = formats.dequantize(part).to(self.dtype)  # (T, D)
        if self.scale is not None:
            values = values * torch.tensor(self.scale, dtype=self.dtype)
        return values.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, fmt={self.fmt}, "
                f"dtype={self.dtype}" + ("" if self.scale is None else f", scale={self.scale}"))
