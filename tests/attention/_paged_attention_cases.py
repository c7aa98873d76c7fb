"""Shared cases for the paged-attention tests: random paged batches and naive attention."""

from __future__ import annotations

import math
import random

import torch

from langchain_ascend.attention.backends.base import BatchLayout, num_blocks_for
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend


def naive_attention(q, k, v, context_len, window=None):
    """q (n, H, D) at positions context_len.., k/v (L, KVH, D) for positions 0..L-1."""
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (L, H, D)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) / math.sqrt(head_dim)  # (H, n, L)
    q_pos = torch.arange(context_len, context_len + n)[:, None]
    k_pos = torch.arange(k.shape[0])[None, :]
    hidden = k_pos > q_pos
    if window is not None:
        hidden |= q_pos - k_pos >= window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)  # (n, H, D)


def run_case(segments, *, block_size, num_heads=4, num_kv_heads=2, head_dim=16, window=None,
             seed=0):
    """segments: list of (context_len, num_new); single-token ones must come first."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    backend = TorchRefBackend(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                              dtype=torch.float32, device=torch.device("cpu"))
    total_blocks = sum(num_blocks_for(c + n, block_size) for c, n in segments) + 3
    kv_cache = torch.zeros(backend.kv_cache_shape(total_blocks, block_size))
    free = list(range(total_blocks))
    rng.shuffle(free)  # non-contiguous, unordered block tables cross block boundaries
    full, tables = [], []
    for context_len, num_new in segments:
        length = context_len + num_new
        k = torch.randn(length, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(length, num_kv_heads, head_dim, generator=gen)
        q = torch.randn(num_new, num_heads, head_dim, generator=gen)
        table = [free.pop() for _ in range(num_blocks_for(length, block_size))]
        slots = [table[p // block_size] * block_size + p % block_size for p in range(length)]
        if context_len:  # an earlier step cached the prefix
            backend.write_kv(kv_cache, k[:context_len], v[:context_len],
                             torch.tensor(slots[:context_len]))
        full.append((q, k, v, slots))
        tables.append(table)
    starts = [0]
    for _, num_new in segments:
        starts.append(starts[-1] + num_new)
    layout = BatchLayout(
        query_start_loc=starts,
        seq_lens=[c + n for c, n in segments],
        block_tables=tables,
        slot_mapping=[s for (c, _), (_, _, _, slots) in zip(segments, full, strict=True) for s in slots[c:]],
        num_decodes=sum(1 for _, n in segments if n == 1),
        block_size=block_size,
    )
    query = torch.cat([q for q, _, _, _ in full])  # (T, H, D)
    key = torch.cat([k[c:] for (c, _), (_, k, _, _) in zip(segments, full, strict=True)])
    value = torch.cat([v[c:] for (c, _), (_, _, v, _) in zip(segments, full, strict=True)])
    out = backend.forward(query, key, value, kv_cache, backend.build_metadata(layout),
                          head_dim ** -0.5, window)
    expected = torch.cat([naive_attention(q, k, v, c, window)
                          for (c, _), (q, k, v, _) in zip(segments, full, strict=True)])
    return out, expected, kv_cache, full, layout
