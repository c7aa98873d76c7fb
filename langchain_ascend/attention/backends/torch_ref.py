"""Paged attention in plain torch: the CPU path and the reference for the other backends.

Cache layout per layer: ``(2, kv_heads, num_blocks, block_size, head_dim)``, so the slots of
one head form a ``(num_blocks * block_size, head_dim)`` matrix and any run of consecutive blocks
is a zero-copy ``(kv_heads, slots, head_dim)`` view with contiguous rows.

Decodes (one query token per request) are attended in ONE batched op, in one of two ways
chosen per step from the block tables:

* shared: when the union of the blocks the decodes use is small (one request, or requests
  sharing a cached prefix such as an agent's system prompt), every decode query attends the
  whole union at once -- a zero-copy view when the union is a run of consecutive blocks, else
  the union's pages gathered once (each shared block read once, not once per request) -- and
  an additive mask keeps for each request exactly the slots of its own blocks up to its
  length. Keys can be visited in any order because attention is a sum over keys; rotary
  positions are already inside the keys. On CPU a union made of a few runs of consecutive
  blocks (a shared prefix plus each request's tail) is attended run by run as views, and the
  partial results are merged with their log-sum-exp weights: no copy at all (faster than
  the gather, see ``docs/performance.md``).
* gather: otherwise (unrelated long contexts) each request's pages are gathered
  (``index_select``) into a padded ``(B, kv_heads, L, head_dim)`` block and a length mask hides
  the padding.

Prefill segments are attended one by one with ``scaled_dot_product_attention``: a fresh prompt
straight from its new keys (causal), a chunk after a cached prefix over its gathered pages with
a causal mask offset by the prefix length. Grouped-query attention never repeats K/V: the
queries of a KV head's group are laid out as extra query rows.

With a logit soft-cap (Gemma 2's ``attn_logit_softcapping``) every path attends through
:func:`~langchain_ascend.attention.backends.softcap.attention` (SDPA has no cap), and decodes
take the shared view or gather instead of the piecewise runs (whose merge needs SDPA's
log-sum-exp).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from langchain_ascend.attention.backends import softcap as capped
from langchain_ascend.attention.backends.base import AttentionBackend, BatchLayout, num_blocks_for

if TYPE_CHECKING:
    import torch

MAX_MERGED_RUNS = 4
"""Most runs of consecutive blocks the shared path attends piecewise (more: one gather)."""
SHARED_MAX_RATIO = 2
"""Use the shared path while the union of the decodes' blocks holds fewer than this many times
the slots of the longest decode context."""


@dataclass
class PrefillSegment:
    """One multi-token segment of the step.

    Attributes:
        start: First packed token of the segment.
        end: One past its last packed token.
        context_len: Tokens of the request already in the cache before this step.
        block_ids: ``(num_blocks,)`` int64 blocks covering the context (None when the segment
            has no cached prefix and attends to its new keys directly).
        mask: ``(num_query, seq_len)`` bool, True where a key is visible: built at the first
            layer that attends through torch (None: not yet, or plain causal without a prefix).
    """

    start: int
    end: int
    context_len: int
    block_ids: torch.Tensor | None
    mask: torch.Tensor | None

    @property
    def seq_len(self) -> int:
        return self.context_len + self.end - self.start


@dataclass
class DecodeGroup:
    """The step's single-token segments, attended together.

    Attributes:
        num_decodes: ``B``.
        seq_lens: Host list of their context lengths (including the new token).
        span: Shared path over consecutive blocks: ``(first_slot, num_slots)`` of the pool
            range attended, else None.
        shared_block_ids: Shared path over scattered blocks: ``(U,)`` int64, the sorted union
            of the decodes' blocks, gathered once per layer; else None.
        runs: Shared path over a few runs of consecutive blocks (CPU): ``(first_slot,
            num_slots, first_column)`` per run, attended piecewise and merged; else None.
        run_empty_rows: Per run, ``(1, 1, B * group)`` bool of the query rows with no key in
            that run (their partial result must not count), or None when there are none.
        block_ids: Gather path: ``(B * max_blocks,)`` int64 pages, padded per request.
        bias: Additive 0 / -inf mask: shared path ``(B * group, num_slots)``, gather path
            ``(B, 1, 1, max_blocks * block_size)``; None when nothing needs hiding.
        key_positions: Shared path ``(B, num_slots)`` position of each slot in each request
            (negative for foreign slots); gather path None. Used for sliding-window masks.
        tables: Gather path: each request's blocks covering its context (host lists), for
            backends that attend request by request; else None.
        paged: Paged path (CPU native kernel): ``(block_tables (B, W) int32, seq_lens (B,)
            int64)``, every request attending its own blocks in one call; else None.
    """

    num_decodes: int
    seq_lens: list[int]
    span: tuple[int, int] | None
    block_ids: torch.Tensor | None
    bias: torch.Tensor | None
    key_positions: torch.Tensor | None = None
    shared_block_ids: torch.Tensor | None = None
    runs: list[tuple[int, int, int]] | None = None
    run_empty_rows: list[torch.Tensor | None] = field(default_factory=list)
    window_bias: dict[int | None, torch.Tensor] = field(default_factory=dict)
    tables: list[list[int]] | None = None
    paged: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class TorchRefMetadata:
    """Device tensors for one step, shared by all layers."""

    slot_mapping: torch.Tensor  # (T,) int64
    decodes: DecodeGroup | None
    prefills: list[PrefillSegment]


def decode_tables(layout: BatchLayout) -> tuple[list[int], list[list[int]]]:
    """``(seq_lens, tables)`` of the step's decodes: each one's context length and the blocks
    covering it (pure function)."""
    count, block_size = layout.num_decodes, layout.block_size
    seq_lens = layout.seq_lens[:count]
    return seq_lens, [layout.block_tables[b][: num_blocks_for(seq_lens[b], block_size)]
                      for b in range(count)]


def union_is_small(num_union_blocks: int, seq_lens: list[int], block_size: int) -> bool:
    """The shared path's rule: the decodes' union of blocks holds fewer than
    :data:`SHARED_MAX_RATIO` times the slots of the longest context (pure function)."""
    return num_union_blocks * block_size < SHARED_MAX_RATIO * max(seq_lens)


def consecutive_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """``(first_block, num_blocks)`` of each run of ascending consecutive ids, in order."""
    runs: list[tuple[int, int]] = []
    for block in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == block:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    return runs


def _can_merge_runs(device) -> bool:
    """Whether the CPU flash-attention op (it returns the log-sum-exp) is there for ``device``."""
    import torch

    return device.type == "cpu" and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _sdpa_kernels(device) -> AbstractContextManager[object]:
    """On CUDA, ``scaled_dot_product_attention`` without the cuDNN kernel, for this call only.

    cuDNN's attention (torch's first choice for bf16 on Hopper) builds an execution plan per
    input shape, and a paged decode changes the key length at every step: an agent hop was
    about ten times slower with it (``docs/performance.md``).
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def _visible_mask(query_positions, key_positions, window: int | None):
    """``(n, L)`` bool: key ``j`` is visible to a query at position ``p`` iff ``p-window < j <= p``."""
    diff = query_positions[:, None] - key_positions[None, :]  # (n, L)
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    return visible


def _additive(hidden, dtype):
    """0 where visible, -inf where ``hidden``."""
    import torch

    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(
        hidden, float("-inf"))


class TorchRefBackend(AttentionBackend):
    """Paged attention from torch ops. Any block size works; 16 by default."""

    name: ClassVar[str] = "torch_ref"
    blocks_dim: ClassVar[int] = 2

    @classmethod
    def preferred_block_size(cls) -> int:
        return 16

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, self.num_kv_heads, num_blocks, block_size, self.head_dim)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    def build_metadata(self, layout: BatchLayout) -> TorchRefMetadata:
        import torch

        slot_mapping = torch.tensor(layout.slot_mapping, dtype=torch.long, device=self.device)
        decodes = self._decode_group(layout) if layout.num_decodes else None
        prefills = []
        for s in range(layout.num_decodes, layout.num_segments):
            start, end = layout.query_start_loc[s], layout.query_start_loc[s + 1]
            seq_len = layout.seq_lens[s]
            context_len = seq_len - (end - start)
            block_ids = None
            if context_len:
                num_blocks = num_blocks_for(seq_len, layout.block_size)
                block_ids = torch.tensor(layout.block_tables[s][:num_blocks], dtype=torch.long,
                                         device=self.device)
            prefills.append(PrefillSegment(start, end, context_len, block_ids, None))
        return TorchRefMetadata(slot_mapping, decodes, prefills)

    def _decode_group(self, layout: BatchLayout) -> DecodeGroup:
        import torch

        device, block_size = self.device, layout.block_size
        count = layout.num_decodes
        seq_lens, tables = decode_tables(layout)
        if count == 1:
            single = self._single_group(tables[0], seq_lens, block_size)
            if single is not None:
                return single
        union = sorted({block for t in tables for block in t})
        if union_is_small(len(union), seq_lens, block_size):
            return self._shared_group(tables, seq_lens, union, block_size)
        width = max(len(t) for t in tables)
        padded = [block for t in tables for block in t + [t[0]] * (width - len(t))]
        block_ids = torch.tensor(padded, dtype=torch.long, device=device)  # (B * width,)
        bias = None
        if any(n != width * block_size for n in seq_lens):
            lens = torch.tensor(seq_lens, device=device)[:, None]  # (B, 1)
            key_pos = torch.arange(width * block_size, device=device)  # (L,)
            bias = _additive(key_pos[None, :] >= lens, self.dtype)[:, None, None, :]  # (B,1,1,L)
        return DecodeGroup(count, seq_lens, None, block_ids, bias, tables=tables)

    def _single_group(self, table: list[int], seq_lens: list[int],
                      block_size: int) -> DecodeGroup | None:
        """One request whose table is one run (a view of exactly its slots) or a few runs
        (attended piecewise, on CPU); nothing to mask either way. None otherwise."""
        import torch

        runs = consecutive_runs(table)
        seq_len = seq_lens[0]
        positions = torch.arange(len(table) * block_size, device=self.device)[None]  # (1, S)
        if len(runs) == 1:
            return DecodeGroup(1, seq_lens, (table[0] * block_size, seq_len), None, None,
                               positions[:, :seq_len])
        if len(runs) > MAX_MERGED_RUNS or not _can_merge_runs(self.device):
            return None
        ids = torch.tensor(table, dtype=torch.long, device=self.device)  # (nb,), position order
        group = DecodeGroup(1, seq_lens, None, None, None, positions, shared_block_ids=ids)
        pieces = self._add_runs(group, [table], runs, block_size)
        first, _, column = pieces[-1]  # runs in position order: the last one ends at seq_len
        pieces[-1] = (first, seq_len - column, column)
        return group

    def _shared_group(self, tables: list[list[int]], seq_lens: list[int], union: list[int],
                      block_size: int) -> DecodeGroup:
        """Decode group attending the union of its blocks (see the module docstring)."""
        import torch

        device, count = self.device, len(tables)
        column = {block: c for c, block in enumerate(union)}
        rows = [b for b, t in enumerate(tables) for _ in t]
        cols = [column[block] for t in tables for block in t]
        ranks = [j for t in tables for j in range(len(t))]
        block_rank = torch.full((count, len(union)), -1, dtype=torch.long, device=device)
        block_rank[rows, cols] = torch.tensor(ranks, device=device)  # (B, U)
        offsets = torch.arange(block_size, device=device)  # (bs,)
        # Slot -> position in the request; foreign slots come out negative.
        positions = (block_rank[:, :, None] * block_size + offsets).flatten(1)  # (B, U*bs)
        bias = None
        if count > 1 or len(union) * block_size != seq_lens[0]:
            lens = torch.tensor(seq_lens, device=device)[:, None]  # (B, 1)
            hidden = (positions < 0) | (positions >= lens)  # (B, U*bs)
            bias = _additive(hidden, self.dtype).repeat_interleave(self.group, dim=0)
        if union[-1] - union[0] + 1 == len(union):  # consecutive: a view of the pool
            span = (union[0] * block_size, len(union) * block_size)
            return DecodeGroup(count, seq_lens, span, None, bias, positions)
        shared = torch.tensor(union, dtype=torch.long, device=device)  # (U,)
        group = DecodeGroup(count, seq_lens, None, None, bias, positions, shared_block_ids=shared)
        runs = consecutive_runs(union)
        if len(runs) <= MAX_MERGED_RUNS and _can_merge_runs(device):
            self._add_runs(group, tables, runs, block_size)
        return group

    def _add_runs(self, group: DecodeGroup, tables: list[list[int]],
                  runs: list[tuple[int, int]], block_size: int) -> list[tuple[int, int, int]]:
        """Let ``group`` be attended run by run (see :class:`DecodeGroup`); returns
        ``group.runs``."""
        import torch

        run_of: dict[int, int] = {}
        pieces: list[tuple[int, int, int]] = []
        column = 0
        for index, (first, length) in enumerate(runs):
            run_of.update((block, index) for block in range(first, first + length))
            pieces.append((first * block_size, length * block_size, column))
            column += length * block_size
        used = [{run_of[block] for block in t} for t in tables]
        for index in range(len(runs)):
            empty = [index not in runs_used for runs_used in used]
            group.run_empty_rows.append(None if not any(empty) else torch.tensor(
                empty, device=self.device).repeat_interleave(self.group)[None, None])
        group.runs = pieces
        return pieces

    def _merged_runs(self, q, kv_cache, group: DecodeGroup, scale):
        """Attention of ``q (1, KVH, R, D)`` over each run as a view, merged by log-sum-exp."""
        import torch

        slots = kv_cache.view(2, self.num_kv_heads, -1, self.head_dim)  # (2, KVH, slots, D)
        outs, lses = [], []
        for (first, length, column), empty in zip(group.runs or (), group.run_empty_rows,
                                                  strict=True):
            bias = None if group.bias is None else group.bias[:, column: column + length]
            out, lse = self._attend_with_lse(q, slots[0, :, first: first + length],
                                             slots[1, :, first: first + length], bias, scale)
            if empty is not None:  # rows with no key here: weight 0 (the op reports lse 0)
                lse = lse.masked_fill(empty, float("-inf"))
            outs.append(out)
            lses.append(lse)
        weights = torch.softmax(torch.stack(lses), dim=0)  # (runs, 1, KVH, R)
        merged = (torch.stack(outs).float() * weights[..., None]).sum(0)  # (1, KVH, R, D)
        return merged.to(q.dtype)

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Store ``key``/``value`` ``(T, kv_heads, head_dim)`` at ``slot_mapping`` ``(T,)``."""
        slots = kv_cache.view(2, self.num_kv_heads, -1, self.head_dim)  # (2, KVH, slots, D)
        slots[0].index_copy_(1, slot_mapping, key.transpose(0, 1).to(kv_cache.dtype))
        slots[1].index_copy_(1, slot_mapping, value.transpose(0, 1).to(kv_cache.dtype))

    def forward(self, query, key, value, kv_cache, metadata: TorchRefMetadata, scale: float,
                sliding_window: int | None = None, softcap: float | None = None):
        self.write_kv(kv_cache, key, value, metadata.slot_mapping)
        return self.attend(query, key, value, kv_cache, metadata, scale, sliding_window, softcap)

    def attend(self, query, key, value, kv_cache, metadata: TorchRefMetadata, scale: float,
               sliding_window: int | None = None, softcap: float | None = None):
        """:meth:`forward` after the step's keys and values are already in ``kv_cache`` (a
        caller that wrote them itself, e.g. ``engine.cpu.models.ops.attend``): ``(T, H, D)``."""
        import torch

        outputs = []
        with _sdpa_kernels(self.device):
            if metadata.decodes is not None:
                decode_q = query[: metadata.decodes.num_decodes]  # (B, H, D)
                outputs.append(self._decode(decode_q, kv_cache, metadata.decodes, scale,
                                            sliding_window, softcap))
            if metadata.prefills:
                outputs.extend(self._prefills(query, key, value, kv_cache, metadata, scale,
                                              sliding_window, softcap))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (T, H, D)

    def _prefills(self, query, key, value, kv_cache, metadata: TorchRefMetadata, scale,
                  window, softcap=None) -> list[torch.Tensor]:
        """The step's prefill segments in order, ``(n, H, D)`` each (subclasses may attend
        them together)."""
        return [self._prefill(query, key, value, kv_cache, seg, scale, window, softcap)
                for seg in metadata.prefills]

    def _decode(self, query, kv_cache, group: DecodeGroup, scale, window, softcap=None):
        """One query token per request, all requests in one attention call."""
        if group.span is None and group.shared_block_ids is None:
            return self._decode_gathered(query, kv_cache, group, scale, window, softcap)
        batch, kv_heads, size = group.num_decodes, self.num_kv_heads, self.group
        q = query.reshape(batch, kv_heads, size, self.head_dim).transpose(0, 1)  # (KVH,B,G,D)
        q = q.reshape(1, kv_heads, batch * size, self.head_dim)  # (1, KVH, B*G, D)
        windowed = window is not None and max(group.seq_lens) > window
        if group.runs is not None and not windowed and not softcap:
            out = self._merged_runs(q, kv_cache, group, scale)  # (1, KVH, B*G, D)
        else:
            keys, values = self._shared_keys(kv_cache, group)  # (KVH, S, D) each
            bias = group.bias
            if windowed or group.runs is not None:  # runs: the slots past each length too
                bias = self._shared_window_bias(group, window if windowed else None)
            out = self._attend_shared(q, keys, values, bias, scale, softcap)  # (1,KVH,B*G,D)
        out = out.view(kv_heads, batch, size, self.head_dim).transpose(0, 1)  # (B,KVH,G,D)
        return out.reshape(batch, self.num_heads, self.head_dim)  # (B, H, D)

    def _attend_shared(self, q, keys, values, bias, scale, softcap=None):
        """``q (1, KVH, R, D)`` over ``keys``/``values`` ``(KVH, S, D)``, additive ``bias``
        ``(R, S)`` or None -> ``(1, KVH, R, D)``. Subclasses swap the kernel."""
        return capped.attention(q, keys[None], values[None], attn_mask=bias, scale=scale,
                                softcap=softcap)

    def _attend_with_lse(self, q, keys, values, bias, scale):
        """As :meth:`_attend_shared`, also returning the log-sum-exp ``(1, KVH, R)`` of each
        row (CPU only: torch's CPU flash-attention op)."""
        import torch

        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, keys[None], values[None], 0.0, False, attn_mask=bias, scale=scale)
        return out, lse  # (1, KVH, R, D), (1, KVH, R)

    def _shared_keys(self, kv_cache, group: DecodeGroup):
        """The shared path's keys and values, ``(KVH, S, D)`` each: a view or one gather."""
        if group.span is not None:
            first, length = group.span
            slots = kv_cache.view(2, self.num_kv_heads, -1, self.head_dim)  # (2, KVH, slots, D)
            return slots[0, :, first: first + length], slots[1, :, first: first + length]
        pages = kv_cache.flatten(3)  # (2, KVH, num_blocks, bs*D)
        union = pages.index_select(2, group.shared_block_ids)  # (2, KVH, U, bs*D)
        union = union.view(2, self.num_kv_heads, -1, self.head_dim)  # (2, KVH, S, D)
        return union[0], union[1]

    def _decode_gathered(self, query, kv_cache, group: DecodeGroup, scale, window,
                         softcap=None):
        """Each request's pages gathered into a padded ``(B, KVH, L, D)`` batch."""
        batch, kv_heads = group.num_decodes, self.num_kv_heads
        pages = kv_cache.flatten(3)  # (2, KVH, num_blocks, bs*D)
        gathered = pages.index_select(2, group.block_ids)  # (2, KVH, B*nb, bs*D)
        gathered = gathered.view(2, kv_heads, batch, -1, self.head_dim)  # (2, KVH, B, L, D)
        keys, values = gathered[0].transpose(0, 1), gathered[1].transpose(0, 1)  # (B, KVH, L, D)
        bias = group.bias
        if window is not None and max(group.seq_lens) > window:
            bias = self._gather_window_bias(group, keys.shape[2], window)
        q = query.reshape(batch, kv_heads, self.group, self.head_dim)  # (B, KVH, G, D)
        out = capped.attention(q, keys, values, attn_mask=bias, scale=scale, softcap=softcap)
        return out.reshape(batch, self.num_heads, self.head_dim)  # (B, H, D)

    def _shared_window_bias(self, group: DecodeGroup, window: int | None):
        """The shared path's bias hiding foreign slots, slots past each length and (with a
        ``window``) slots before it: ``(B * group, S)``, built once per step and window."""
        import torch

        bias = group.window_bias.get(window)
        pos = group.key_positions  # (B, S)
        if bias is None and pos is not None:
            lens = torch.tensor(group.seq_lens, device=pos.device)[:, None]  # (B, 1)
            hidden = (pos < 0) | (pos >= lens)
            if window is not None:
                hidden = hidden | (pos <= lens - 1 - window)
            bias = _additive(hidden, self.dtype).repeat_interleave(self.group, dim=0)
            group.window_bias[window] = bias  # (B*G, S)
        return bias

    def _gather_window_bias(self, group: DecodeGroup, num_keys: int, window: int):
        import torch

        bias = group.window_bias.get(window)
        if bias is None:
            device = self.device
            lens = torch.tensor(group.seq_lens, device=device)[:, None]  # (B, 1)
            key_pos = torch.arange(num_keys, device=device)[None, :]  # (1, L)
            hidden = (key_pos >= lens) | (key_pos <= lens - 1 - window)  # (B, L)
            bias = _additive(hidden, self.dtype)[:, None, None, :]  # (B, 1, 1, L)
            group.window_bias[window] = bias
        return bias

    def _prefill(self, query, key, value, kv_cache, seg: PrefillSegment, scale, window,
                 softcap=None):
        """A multi-token segment: causal over its new tokens, full over its cached prefix."""
        import torch

        q = query[seg.start: seg.end].transpose(0, 1)[None]  # (1, H, n, D)
        if seg.block_ids is not None and seg.mask is None:  # built once, for every layer
            q_pos = torch.arange(seg.context_len, seg.seq_len, device=q.device)  # (n,)
            seg.mask = _visible_mask(q_pos, torch.arange(seg.seq_len, device=q.device), None)
        mask = seg.mask  # (n, L)
        if seg.block_ids is None:
            k = key[seg.start: seg.end].transpose(0, 1)[None]  # (1, KVH, n, D)
            v = value[seg.start: seg.end].transpose(0, 1)[None]
            if kv_cache.dtype != q.dtype:  # the values the cache holds: a cold prompt attends
                # exactly what a later cached-prefix pass will read back
                k, v = (x.to(kv_cache.dtype).to(q.dtype) for x in (k, v))
        else:
            pages = kv_cache.flatten(3)  # (2, KVH, num_blocks, bs*D)
            gathered = pages.index_select(2, seg.block_ids)  # (2, KVH, nb, bs*D)
            gathered = gathered.view(2, self.num_kv_heads, -1, self.head_dim)[:, :, : seg.seq_len]
            k, v = gathered[0][None].to(q.dtype), gathered[1][None].to(q.dtype)  # (1, KVH, L, D)
        if window is not None and seg.seq_len > window:
            device = q.device
            q_pos = torch.arange(seg.context_len, seg.seq_len, device=device)  # (n,)
            k_pos = torch.arange(seg.seq_len - k.shape[2], seg.seq_len, device=device)  # (L,)
            mask = _visible_mask(q_pos, k_pos, window)  # (n, L)
        out = capped.attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, softcap=softcap,
            enable_gqa=self.num_heads != self.num_kv_heads)  # (1, H, n, D)
        return out[0].transpose(0, 1)  # (n, H, D)
