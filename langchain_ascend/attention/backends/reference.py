"""The reference decode path: one query token per row, lengths as device tensors.

Every row of a decode batch has a fixed-width int32 block table (``(B, W)``: its blocks in
position order, padded with any valid block id) and a context length (``seq_lens (B,)``, the
new token included). One layer's attention is then

1. write the new ``key``/``value`` ``(B, KVH, D)`` at ``slot_mapping (B,)``;
2. gather the ``B * W`` pages of the table (``index_select``) into ``(B, KVH, W * bs, D)``;
3. hide keys at positions ``>= seq_lens`` (and, with a sliding window, ``< seq_lens - window``)
   with a boolean mask;
4. ``scaled_dot_product_attention`` with the ``G`` query heads of a KV head as extra query rows
   (no K/V repeat); with a logit soft-cap (Gemma 2) the explicit capped scores
   (``backends.softcap``).

Nothing reads a tensor back to the host and every shape is fixed by ``(B, W)``, so the same code
runs eagerly, under ``torch.compile(fullgraph=True)`` and inside a captured CUDA / NPU graph; it
is also the oracle the other backends' decode paths are tested against. It is written for both
cache layouts of this package: ``blocks_dim == 2`` (torch_ref / cpu:
``(2, KVH, num_blocks, bs, D)``) and ``blocks_dim == 1`` (npu and the base layout:
``(2, num_blocks, bs, KVH, D)``).

A padding row (the static step pads a batch to its bucket) points its slot and its whole table
at the scratch block with length 1: it writes only the scratch block and reads only it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend.attention.backends import softcap as capped
from langchain_ascend.attention.backends.base import BatchLayout, num_blocks_for

if TYPE_CHECKING:
    import torch


@dataclass
class DecodeMetadata:
    """Device tensors of one decode batch of ``B`` rows with table width ``W``.

    Attributes:
        slot_mapping: ``(B,)`` int64 cache slot of each row's new token.
        block_tables: ``(B, W)`` int32 blocks of each row, position order, padded.
        seq_lens: ``(B,)`` int64 context length of each row (new token included), >= 1.
        key_positions: ``(W * bs,)`` int64 ``0 .. W * bs - 1`` (the position of each gathered
            key column).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    key_positions: torch.Tensor


def build_decode_metadata(layout: BatchLayout, *, width: int, pad_block: int,
                          device: Any) -> DecodeMetadata:
    """The :class:`DecodeMetadata` of a pure-decode ``layout`` (host lists -> fresh tensors).

    For tests and eager callers; the static step fills persistent buffers instead.

    Raises:
        ValueError: ``layout`` holds a multi-token segment or a context wider than ``width``.
    """
    import torch

    if layout.num_decodes != layout.num_segments:
        raise ValueError("the reference decode path takes single-token segments only")
    rows = []
    for table, seq_len in zip(layout.block_tables, layout.seq_lens, strict=True):
        used = table[: num_blocks_for(seq_len, layout.block_size)]
        if len(used) > width:
            raise ValueError(f"a context of {seq_len} tokens needs {len(used)} blocks, "
                             f"wider than the table ({width})")
        rows.append(used + [pad_block] * (width - len(used)))
    return DecodeMetadata(
        slot_mapping=torch.tensor(layout.slot_mapping, dtype=torch.long, device=device),
        block_tables=torch.tensor(rows, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(layout.seq_lens, dtype=torch.long, device=device),
        key_positions=torch.arange(width * layout.block_size, device=device),
    )


def write_decode_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    slot_mapping: torch.Tensor, blocks_dim: int) -> None:
    """Store ``key``/``value`` ``(B, KVH, D)`` at ``slot_mapping (B,)`` (int64), in place.

    ONE ``index_put_`` over a view of the whole layer cache (keys and values together), never
    a write into ``slots[0]`` / ``slots[1]``: under ``torch.compile`` a write through such a
    sub-view is functionalized into a scatter of the whole cache (inductor then copies every
    slot of every layer at every step), while an ``index_put_`` on the cache's own view is
    turned back into the in-place write. The view is contiguous (no hidden copy on backends
    that make ``self`` contiguous first) and the indices are the slot tensor alone, so a
    captured graph allocates nothing that depends on the inputs. Rows sharing a slot (padding
    rows on the scratch block) leave one of their values there, unspecified which.
    """
    import torch

    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    if blocks_dim == 2:
        slots = kv_cache.view(2, num_kv_heads, -1, head_dim)  # (2, KVH, slots, D)
        slots[:, :, slot_mapping] = torch.stack((key, value)).transpose(1, 2)  # (2, KVH, B, D)
    else:
        slots = kv_cache.view(2, -1, num_kv_heads, head_dim)  # (2, slots, KVH, D)
        slots[:, slot_mapping] = torch.stack((key, value))  # (2, B, KVH, D)


def gather_pages(kv_cache: torch.Tensor, block_tables: torch.Tensor, blocks_dim: int,
                 num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of every row's table, ``(B, KVH, W * bs, D)`` each."""
    batch, width = block_tables.shape
    flat_table = block_tables.reshape(-1)  # (B*W,)
    if blocks_dim == 2:
        pages = kv_cache.flatten(3).index_select(2, flat_table)  # (2, KVH, B*W, bs*D)
        pages = pages.view(2, num_kv_heads, batch, -1, head_dim)  # (2, KVH, B, L, D)
        return pages[0].transpose(0, 1), pages[1].transpose(0, 1)  # (B, KVH, L, D)
    pages = kv_cache.index_select(1, flat_table)  # (2, B*W, bs, KVH, D)
    pages = pages.view(2, batch, -1, num_kv_heads, head_dim)  # (2, B, L, KVH, D)
    return pages[0].transpose(1, 2), pages[1].transpose(1, 2)  # (B, KVH, L, D)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     kv_cache: torch.Tensor, metadata: DecodeMetadata, scale: float,
                     sliding_window: int | None, *, blocks_dim: int,
                     softcap: float | None = None) -> torch.Tensor:
    """Write the rows' K/V and attend each row over its table (module docstring).

    Args:
        query: ``(B, H, D)``.
        key: ``(B, KVH, D)``.
        value: ``(B, KVH, D)``.
        kv_cache: One layer's cache tensor.
        metadata: The batch's :class:`DecodeMetadata`.
        scale: Softmax scale.
        sliding_window: Attend only the last this many positions (None: all).
        blocks_dim: Which dimension of ``kv_cache`` block ids index (1 or 2).
        softcap: Logit soft-cap of the scaled scores (Gemma 2; None: none).

    Returns:
        ``(B, H, D)`` attention output.
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    write_decode_kv(kv_cache, key, value, metadata.slot_mapping, blocks_dim)
    keys, values = gather_pages(kv_cache, metadata.block_tables, blocks_dim, num_kv_heads,
                                head_dim)  # (B, KVH, L, D) each
    lens = metadata.seq_lens[:, None]  # (B, 1)
    key_pos = metadata.key_positions[None, :]  # (1, L)
    visible = key_pos < lens  # (B, L)
    if sliding_window is not None:
        visible = visible & (key_pos >= lens - sliding_window)
    q = query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (B, KVH, G, D)
    out = capped.attention(q, keys, values, attn_mask=visible[:, None, None, :], scale=scale,
                           softcap=softcap)  # (B, KVH, G, D)
    return out.reshape(batch, num_heads, head_dim)  # (B, H, D)


class ReferenceDecode:
    """The reference path as an attention backend for decode-only steps.

    It shares the cache of the runner's own backend (``blocks_dim`` from it) and takes a
    :class:`DecodeMetadata` as the step metadata, so
    :func:`~langchain_ascend.attention.registry.paged_attention_forward` can call it like any
    backend.

    Args:
        blocks_dim: The cache layout (``AttentionBackend.blocks_dim`` of the runner's backend).
    """

    name = "reference"

    def __init__(self, *, blocks_dim: int) -> None:
        if blocks_dim not in (1, 2):
            raise ValueError(f"blocks_dim must be 1 or 2, got {blocks_dim}")
        self.blocks_dim = blocks_dim

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: DecodeMetadata, scale: float,
                sliding_window: int | None = None,
                softcap: float | None = None) -> torch.Tensor:
        """As :meth:`AttentionBackend.forward` for ``T == B`` single-token rows."""
        return decode_attention(query, key, value, kv_cache, metadata, scale, sliding_window,
                                blocks_dim=self.blocks_dim, softcap=softcap)
