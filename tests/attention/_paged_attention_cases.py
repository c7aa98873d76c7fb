"""Shared cases for the paged-attention tests: random paged batches and naive attention."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from langchain_ascend.attention.backends.base import BatchLayout, num_blocks_for
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend


def naive_attention(q, k, v, context_len, window=None, softcap=None):
    """q (n, H, D) at positions context_len.., k/v (L, KVH, D) for positions 0..L-1; with
    ``softcap`` the scaled scores become ``softcap * tanh(s / softcap)`` first (Gemma 2)."""
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (L, H, D)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) / math.sqrt(head_dim)  # (H, n, L)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(context_len, context_len + n)[:, None]
    k_pos = torch.arange(k.shape[0])[None, :]
    hidden = k_pos > q_pos
    if window is not None:
        hidden |= q_pos - k_pos >= window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)  # (n, H, D)


def read_slots(kv_cache, slots, num_kv_heads, head_dim, blocks_dim):
    """Keys and values stored at ``slots`` as two ``(n, KVH, D)`` tensors, for either layout."""
    index = torch.tensor(slots)
    if blocks_dim == 2:  # (2, KVH, blocks, bs, D)
        flat = kv_cache.view(2, num_kv_heads, -1, head_dim)
        return flat[0][:, index].transpose(0, 1), flat[1][:, index].transpose(0, 1)
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)  # (2, blocks, bs, KVH, D)
    return flat[0][index], flat[1][index]


@dataclass
class Case:
    """A packed step over random data, with its naive-attention expectation."""

    backend: TorchRefBackend
    kv_cache: torch.Tensor
    layout: BatchLayout
    query: torch.Tensor  # (T, H, D)
    key: torch.Tensor  # (T, KVH, D) new keys
    value: torch.Tensor
    sequences: list  # per segment: (q, full k, full v, slots, context_len)
    expected: torch.Tensor  # (T, H, D)
    softcap: float | None = None  # the attention logit soft-cap run() passes (Gemma 2)

    def run(self, window=None):
        metadata = self.backend.build_metadata(self.layout)
        out = self.backend.forward(self.query, self.key, self.value, self.kv_cache, metadata,
                                   self.backend.head_dim ** -0.5, window, self.softcap)
        return out, metadata


def make_case(segments, *, block_size, num_heads=4, num_kv_heads=2, head_dim=16, window=None,
              allocation="shuffled", shared_prefix=0, seed=0, dtype=torch.float32,
              pool_slack=3, backend_cls=TorchRefBackend, softcap=None) -> Case:
    """Build a step.

    Args:
        segments: ``(context_len, num_new)`` pairs; single-token ones first.
        allocation: ``"shuffled"`` (random unordered blocks), ``"contiguous"`` (blocks in
            order, requests one after another), ``"gapped"`` (like contiguous, one unused block
            after the shared prefix and after each request: every request's own blocks form a
            separate run).
        shared_prefix: Tokens (a multiple of ``block_size``) that every segment with at least
            that much context shares: same K/V, same blocks (a prefix-cache hit).
        pool_slack: Blocks in the pool beyond those needed (spreads shuffled tables apart).
        backend_cls: torch_ref or a backend sharing its cache layout (the CPU backend).
        softcap: Attention logit soft-cap of the expectation and of :meth:`Case.run`.
    """
    assert shared_prefix % block_size == 0
    gen = torch.Generator().manual_seed(seed)
    backend = backend_cls(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                              dtype=dtype, device=torch.device("cpu"))
    total = sum(num_blocks_for(c + n, block_size) for c, n in segments) + pool_slack
    total += len(segments) + 1 if allocation == "gapped" else 0
    kv_cache = torch.zeros(backend.kv_cache_shape(total, block_size), dtype=dtype)
    free = list(range(total))[::-1]
    if allocation == "shuffled":
        random.Random(seed).shuffle(free)
    root_k = torch.randn(shared_prefix, num_kv_heads, head_dim, generator=gen)
    root_v = torch.randn(shared_prefix, num_kv_heads, head_dim, generator=gen)
    root_blocks = [free.pop() for _ in range(shared_prefix // block_size)]
    if allocation == "gapped" and root_blocks:
        free.pop()
    sequences, tables = [], []
    for context_len, num_new in segments:
        length = context_len + num_new
        k = torch.randn(length, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(length, num_kv_heads, head_dim, generator=gen)
        q = torch.randn(num_new, num_heads, head_dim, generator=gen)
        shares = shared_prefix and context_len >= shared_prefix
        table = list(root_blocks) if shares else []
        if shares:
            k[:shared_prefix], v[:shared_prefix] = root_k, root_v
        table += [free.pop() for _ in range(num_blocks_for(length, block_size) - len(table))]
        if allocation == "gapped":
            free.pop()
        slots = [table[p // block_size] * block_size + p % block_size for p in range(length)]
        if context_len:  # an earlier step cached the prefix
            backend.write_kv(kv_cache, k[:context_len].to(dtype), v[:context_len].to(dtype),
                             torch.tensor(slots[:context_len]))
        sequences.append((q, k, v, slots, context_len))
        tables.append(table)
    starts = [0]
    for _, num_new in segments:
        starts.append(starts[-1] + num_new)
    layout = BatchLayout(
        query_start_loc=starts,
        seq_lens=[c + n for c, n in segments],
        block_tables=tables,
        slot_mapping=[s for _, _, _, slots, c in sequences for s in slots[c:]],
        num_decodes=sum(1 for _, n in segments if n == 1),
        block_size=block_size,
    )
    return Case(
        backend=backend,
        kv_cache=kv_cache,
        layout=layout,
        query=torch.cat([q for q, *_ in sequences]).to(dtype),
        key=torch.cat([k[c:] for _, k, _, _, c in sequences]).to(dtype),
        value=torch.cat([v[c:] for _, _, v, _, c in sequences]).to(dtype),
        sequences=sequences,
        expected=torch.cat([naive_attention(q, k, v, c, window, softcap)
                            for q, k, v, _, c in sequences]),
        softcap=softcap,
    )
