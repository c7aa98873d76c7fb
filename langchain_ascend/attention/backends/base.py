"""The attention-backend interface: paged K/V cache layout, cache writes, packed attention.

One engine step is ONE packed forward: the new tokens of every scheduled request are laid end
to end (``T`` tokens in all). Requests with a single new token ("decodes") come first, then the
multi-token ones ("prefills", possibly a later chunk of a prompt whose earlier chunks are
already in the cache). For every layer the model computes ``q, k, v`` for the ``T`` tokens and
calls the backend, which

1. writes the new ``k, v`` into the paged cache at ``slot_mapping`` (slot =
   ``block_id * block_size + offset``), then
2. attends: query ``i`` of a segment at absolute position ``p`` sees the segment's keys at
   positions ``0 .. p`` (its cached prefix and the new tokens up to itself).

The host side describes the step once with a :class:`BatchLayout` (plain Python lists); the
backend turns it into device tensors once per step (:meth:`AttentionBackend.build_metadata`)
and reuses them for every layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_ascend.int_math import cdiv
from langchain_ascend.validation import check_count

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BatchLayout:
    """Host-side description of one packed step (pure Python, no tensors).

    Invariants:
        * Segment ``s`` owns packed tokens ``query_start_loc[s] .. query_start_loc[s + 1] - 1``.
        * The first ``num_decodes`` segments have exactly one query token each.
        * ``seq_lens[s]`` is the segment's context length after this step (cached prefix plus
          new tokens); the prefix is ``seq_lens[s] - num_query_tokens(s)``.
        * ``block_tables[s]`` covers at least ``seq_lens[s]`` slots.
        * ``slot_mapping[t]`` is the cache slot of packed token ``t``.

    Attributes:
        query_start_loc: Cumulative query lengths, ``num_segments + 1`` entries starting at 0.
        seq_lens: Context length of each segment after this step.
        block_tables: Each segment's KV block ids, in position order.
        slot_mapping: Cache slot of every packed token.
        num_decodes: How many leading segments are single-token decodes.
        block_size: Tokens per KV block.
    """

    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]
    num_decodes: int
    block_size: int

    @property
    def num_segments(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    def query_len(self, segment: int) -> int:
        """New tokens of ``segment`` in this step."""
        return self.query_start_loc[segment + 1] - self.query_start_loc[segment]

    def context_len(self, segment: int) -> int:
        """Tokens of ``segment`` already in the cache before this step."""
        return self.seq_lens[segment] - self.query_len(segment)


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` slots."""
    return cdiv(num_tokens, block_size)


class AttentionBackend(ABC):
    """Paged attention for one model: cache layout, cache writes and packed attention.

    A backend instance is bound to one model's attention geometry. Per-layer KV caches are
    separate tensors allocated by :class:`~langchain_ascend.engine.worker.kv_cache.KVCache` with
    :meth:`kv_cache_shape`, zero-filled; index 0 of the first dimension holds keys, 1 values.
    The default layout is ``(2, num_blocks, block_size, num_kv_heads, head_dim)``, so
    ``kv_cache[0]`` and ``kv_cache[1]`` are the ``[num_blocks, block_size, kv_heads, head_dim]``
    tensors paged kernels expect; a backend may choose another (``blocks_dim`` says which
    dimension block ids index).

    Args:
        num_heads: Query heads.
        num_kv_heads: Key/value heads (``num_heads`` must be a multiple: GQA/MQA).
        head_dim: Size of one head.
        dtype: Dtype of the queries, keys and values (the model's dtype).
        device: Device of the cache.
        cache_dtype: Dtype the cache stores keys and values in (default: ``dtype``); another
            only where :meth:`supports_cache_dtype` says so.
    """

    name: ClassVar[str] = "base"
    blocks_dim: ClassVar[int] = 1
    """Dimension of a layer's cache tensor that block ids index."""
    supports_softcap: ClassVar[bool] = True
    """Whether :meth:`forward` applies an attention logit soft-cap (Gemma 2); a backend whose
    device kernel has none says False and the runner refuses such a model at start
    (:func:`~langchain_ascend.attention.registry.check_backend_runs`)."""

    def __init__(self, *, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device,
                 cache_dtype: torch.dtype | None = None) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.cache_dtype = cache_dtype or dtype
        if self.cache_dtype != dtype and not self.supports_cache_dtype(self.cache_dtype):
            raise ValueError(
                f"kv_cache_dtype={str(self.cache_dtype).removeprefix('torch.')} is not "
                f"supported by the {self.name} attention backend for a "
                f"{str(dtype).removeprefix('torch.')} model on {device}: use 'auto' or the "
                "model's dtype")

    def supports_cache_dtype(self, cache_dtype: torch.dtype) -> bool:
        """Whether this backend stores keys and values as ``cache_dtype`` under a model of
        ``self.dtype`` (the base: only the model's own dtype)."""
        return cache_dtype == self.dtype

    @classmethod
    @abstractmethod
    def preferred_block_size(cls) -> int:
        """The block size this backend runs fastest with."""

    @classmethod
    def check_block_size(cls, block_size: int) -> None:
        """Raise ``ValueError`` when ``block_size`` cannot be used with this backend."""
        check_count("block_size", block_size)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache tensor."""
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def bytes_per_block(self, block_size: int, num_layers: int) -> int:
        """Bytes one KV block takes across all layers."""
        import torch

        per_layer = 2 * block_size * self.num_kv_heads * self.head_dim
        return per_layer * num_layers * torch.empty((), dtype=self.cache_dtype).element_size()

    @abstractmethod
    def build_metadata(self, layout: BatchLayout) -> Any:
        """Turn the step's host layout into whatever :meth:`forward` needs on the device.

        Called once per step; the result is shared by every layer.
        """

    @abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: Any, scale: float,
                sliding_window: int | None = None,
                softcap: float | None = None) -> torch.Tensor:
        """Write the new K/V into ``kv_cache`` and attend over the packed batch.

        Args:
            query: ``(T, num_heads, head_dim)`` queries of the packed tokens.
            key: ``(T, num_kv_heads, head_dim)`` keys of the packed tokens (rotary applied).
            value: ``(T, num_kv_heads, head_dim)`` values of the packed tokens.
            kv_cache: This layer's cache tensor (shape from :meth:`kv_cache_shape`).
            metadata: The step's :meth:`build_metadata` result.
            scale: Softmax scale (usually ``head_dim ** -0.5``).
            sliding_window: Keys further back than this many positions are not attended
                (``None``: full attention).
            softcap: Logit soft-cap: each scaled score ``s`` becomes
                ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2's
                ``attn_logit_softcapping``; ``None``: none).

        Returns:
            ``(T, num_heads, head_dim)`` attention output.
        """
