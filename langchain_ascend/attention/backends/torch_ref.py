"""Paged attention in plain torch: the CPU path and the reference for the other backends.

Decodes (one query token per request) are attended in ONE batched op: each request's pages are
gathered into a padded ``(B, L, kv_heads, head_dim)`` block, and an additive length mask hides
the padding. Prefill segments are attended one by one with
``scaled_dot_product_attention``: a fresh prompt straight from the new keys (causal), a chunk
after a cached prefix over its gathered pages with a causal mask offset by the prefix length.
Grouped-query attention never repeats K/V: queries are viewed as ``(kv_heads, group, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from langchain_ascend.attention.backends.base import AttentionBackend, BatchLayout, num_blocks_for

if TYPE_CHECKING:
    import torch


@dataclass
class PrefillSegment:
    """One multi-token segment of the step.

    Attributes:
        start: First packed token of the segment.
        end: One past its last packed token.
        context_len: Tokens of the request already in the cache before this step.
        block_table: ``(num_blocks,)`` int64 block ids covering the context (None when the
            segment has no cached prefix and attends to its new keys directly).
        mask: ``(num_query, seq_len)`` bool, True where a key is visible (None: plain causal).
    """

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor | None
    mask: torch.Tensor | None

    @property
    def seq_len(self) -> int:
        return self.context_len + self.end - self.start


@dataclass
class TorchRefMetadata:
    """Device tensors for one step, shared by all layers.

    Attributes:
        slot_mapping: ``(T,)`` int64 cache slot of every packed token.
        num_decodes: Leading single-token segments.
        decode_block_tables: ``(B, max_blocks)`` int64 (padded with block 0), or None.
        decode_seq_lens: Host list of the decodes' context lengths.
        decode_bias: ``(B, 1, 1, max_blocks * block_size)`` additive mask (0 / -inf) hiding
            padding, or None when it is not needed (one decode: its keys are sliced instead).
        prefills: The multi-token segments, in packed order.
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor | None
    decode_seq_lens: list[int]
    decode_bias: torch.Tensor | None
    prefills: list[PrefillSegment]
    block_size: int
    window_cache: dict[int, object] = field(default_factory=dict)


def _visible_mask(query_positions, key_positions, window: int | None):
    """``(n, L)`` bool: key ``j`` is visible to a query at position ``p`` iff ``p-window < j <= p``."""
    diff = query_positions[:, None] - key_positions[None, :]  # (n, L)
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    return visible


class TorchRefBackend(AttentionBackend):
    """Gather pages + matmul/SDPA. Any block size works; 16 balances gather cost and reuse."""

    name: ClassVar[str] = "torch_ref"

    @classmethod
    def preferred_block_size(cls) -> int:
        return 16

    def build_metadata(self, layout: BatchLayout) -> TorchRefMetadata:
        import torch

        device, block_size = self.device, layout.block_size
        slot_mapping = torch.tensor(layout.slot_mapping, dtype=torch.long, device=device)
        num_decodes = layout.num_decodes
        decode_seq_lens = layout.seq_lens[:num_decodes]
        decode_tables = decode_bias = None
        if num_decodes:
            max_len = max(decode_seq_lens)
            width = num_blocks_for(max_len, block_size)
            rows = [table[:width] + [0] * (width - min(width, len(table)))
                    for table in layout.block_tables[:num_decodes]]
            decode_tables = torch.tensor(rows, dtype=torch.long, device=device)  # (B, nb)
            if num_decodes > 1 and any(n != width * block_size for n in decode_seq_lens):
                lens = torch.tensor(decode_seq_lens, device=device)  # (B,)
                key_pos = torch.arange(width * block_size, device=device)  # (L,)
                hidden = key_pos[None, :] >= lens[:, None]  # (B, L)
                decode_bias = torch.zeros(hidden.shape, dtype=self.dtype, device=device)
                decode_bias.masked_fill_(hidden, float("-inf"))
                decode_bias = decode_bias[:, None, None, :]  # (B, 1, 1, L)
        prefills = []
        for s in range(num_decodes, layout.num_segments):
            start, end = layout.query_start_loc[s], layout.query_start_loc[s + 1]
            context_len = layout.seq_lens[s] - (end - start)
            table = mask = None
            if context_len:
                nb = num_blocks_for(layout.seq_lens[s], block_size)
                table = torch.tensor(layout.block_tables[s][:nb], dtype=torch.long, device=device)
                q_pos = torch.arange(context_len, layout.seq_lens[s], device=device)  # (n,)
                k_pos = torch.arange(layout.seq_lens[s], device=device)  # (L,)
                mask = _visible_mask(q_pos, k_pos, None)  # (n, L)
            prefills.append(PrefillSegment(start, end, context_len, table, mask))
        return TorchRefMetadata(slot_mapping, num_decodes, decode_tables, decode_seq_lens,
                                decode_bias, prefills, block_size)

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Store ``key``/``value`` ``(T, kv_heads, head_dim)`` at ``slot_mapping`` ``(T,)``."""
        num_slots = kv_cache.shape[1] * kv_cache.shape[2]
        flat = kv_cache.view(2, num_slots, self.num_kv_heads, self.head_dim)  # (2, slots, KVH, D)
        flat[0].index_copy_(0, slot_mapping, key)
        flat[1].index_copy_(0, slot_mapping, value)

    def forward(self, query, key, value, kv_cache, metadata: TorchRefMetadata, scale: float,
                sliding_window: int | None = None):
        import torch

        self.write_kv(kv_cache, key, value, metadata.slot_mapping)
        outputs = []
        if metadata.num_decodes:
            decode_q = query[: metadata.num_decodes]  # (B, H, D)
            outputs.append(self._decode(decode_q, kv_cache, metadata, scale, sliding_window))
        for seg in metadata.prefills:
            outputs.append(self._prefill(query, key, value, kv_cache, seg, scale, sliding_window))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (T, H, D)

    def _decode(self, query, kv_cache, meta: TorchRefMetadata, scale, window):
        """One query token per request, all requests in one batched matmul."""
        import torch

        batch = query.shape[0]
        pages = kv_cache[:, meta.decode_block_tables]  # (2, B, nb, bs, KVH, D)
        keys = pages[0].flatten(1, 2)  # (B, L, KVH, D)
        values = pages[1].flatten(1, 2)  # (B, L, KVH, D)
        bias = meta.decode_bias
        if batch == 1:
            keys = keys[:, : meta.decode_seq_lens[0]]
            values = values[:, : meta.decode_seq_lens[0]]
        if window is not None and max(meta.decode_seq_lens) > window:
            bias = self._decode_window_bias(meta, keys.shape[1], window)
        group = self.num_heads // self.num_kv_heads
        q = (query * scale).reshape(batch, self.num_kv_heads, group, self.head_dim)  # (B, KVH, G, D)
        scores = torch.matmul(q, keys.permute(0, 2, 3, 1))  # (B, KVH, G, L)
        if bias is not None:
            scores = scores + bias
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        out = torch.matmul(probs, values.transpose(1, 2))  # (B, KVH, G, D)
        return out.reshape(batch, self.num_heads, self.head_dim)  # (B, H, D)

    def _decode_window_bias(self, meta: TorchRefMetadata, num_keys: int, window: int):
        """Additive mask for decodes that also hides keys older than the sliding window."""
        import torch

        cached = meta.window_cache.get(window)
        if cached is None:
            device = meta.slot_mapping.device
            lens = torch.tensor(meta.decode_seq_lens, device=device)  # (B,)
            key_pos = torch.arange(num_keys, device=device)  # (L,)
            query_pos = lens - 1  # (B,)
            diff = query_pos[:, None] - key_pos[None, :]  # (B, L)
            hidden = (diff < 0) | (diff >= window)
            bias = torch.zeros(hidden.shape, dtype=self.dtype, device=device)
            cached = bias.masked_fill_(hidden, float("-inf"))[:, None, None, :]  # (B, 1, 1, L)
            meta.window_cache[window] = cached
        return cached

    def _prefill(self, query, key, value, kv_cache, seg: PrefillSegment, scale, window):
        """A multi-token segment: causal over its new tokens, full over its cached prefix."""
        import torch
        import torch.nn.functional as F

        q = query[seg.start: seg.end].transpose(0, 1)[None]  # (1, H, n, D)
        mask = seg.mask
        if seg.block_table is None:
            k = key[seg.start: seg.end].transpose(0, 1)[None]  # (1, KVH, n, D)
            v = value[seg.start: seg.end].transpose(0, 1)[None]
        else:
            pages = kv_cache[:, seg.block_table]  # (2, nb, bs, KVH, D)
            k = pages[0].flatten(0, 1)[: seg.seq_len].transpose(0, 1)[None]  # (1, KVH, L, D)
            v = pages[1].flatten(0, 1)[: seg.seq_len].transpose(0, 1)[None]
        if window is not None and seg.seq_len > window:
            device = q.device
            q_pos = torch.arange(seg.context_len, seg.seq_len, device=device)  # (n,)
            k_pos = torch.arange(seg.seq_len - k.shape[2], seg.seq_len, device=device)  # (L,)
            mask = _visible_mask(q_pos, k_pos, window)  # (n, L)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
            enable_gqa=self.num_heads != self.num_kv_heads)  # (1, H, n, D)
        return out[0].transpose(0, 1)  # (n, H, D)
