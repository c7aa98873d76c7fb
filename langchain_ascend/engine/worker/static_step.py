"""The static decode step: pure-decode steps over persistent buffers, one bucket at a time.

A pure-decode step runs at a bucket ``(B, W)``: the batch padded to the next of
:func:`capture_sizes` rows, the block table to the next of :func:`table_widths` blocks. Every
input lives in ONE persistent device buffer, filled by one non-blocking copy from a host
staging buffer, and every bucket's views keep their addresses, so :meth:`StaticDecodeStep.step_fn`
can be captured (``engine.worker.graphs``) or compiled with ``fullgraph=True``. Padding rows
and columns point at the runner's scratch block, so padding never writes a real block.
Invariant for the pinned staging: the host refills it only after the previous step's tokens
were read back (the sampler's ``tolist()`` synchronises), so a copy in flight is never
overwritten. The buffer layout: docs/performance.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.attention import registry
from langchain_ascend.attention.backends.base import BatchLayout, num_blocks_for
from langchain_ascend.attention.backends.reference import DecodeMetadata, ReferenceDecode
from langchain_ascend.validation import check_count

if TYPE_CHECKING:
    import torch

Bucket = tuple[int, int]
"""``(rows, table width in blocks)`` of a static step."""

MIN_TABLE_WIDTH = 4
"""Narrowest table bucket, in blocks."""


def capture_sizes(max_batch_size: int) -> list[int]:
    """Batch buckets: 1, 2, 4, 8, then steps of 8, up to the first one >= ``max_batch_size``.

    Raises:
        ValueError: ``max_batch_size < 1``.
    """
    check_count("max_batch_size", max_batch_size)
    sizes = [1]
    while sizes[-1] < max_batch_size:
        sizes.append(sizes[-1] * 2 if sizes[-1] < 8 else sizes[-1] + 8)
    return sizes


def table_widths(max_width: int) -> list[int]:
    """Table-width buckets in blocks: powers of two from :data:`MIN_TABLE_WIDTH`, the last
    one ``max_width`` itself."""
    widths = []
    width = MIN_TABLE_WIDTH
    while width < max_width:
        widths.append(width)
        width *= 2
    widths.append(max_width)
    return widths


def bucket_for(value: int, buckets: list[int]) -> int | None:
    """The smallest bucket >= ``value``, or None when ``value`` exceeds them all."""
    for bucket in buckets:
        if bucket >= value:
            return bucket
    return None


class StaticDecodeStep:
    """Persistent buffers and the step function of pure-decode steps.

    Args:
        model: The HF causal LM (attention routed to ``registry``).
        kv_caches: The runner's per-layer cache tensors.
        blocks_dim: The cache layout (the runner backend's ``blocks_dim``).
        block_size: Tokens per block.
        scratch_block_id: The block padding rows write and read.
        max_batch_size: Most rows of a step.
        max_model_len: Longest context (sizes the widest table).
        device: Where the model runs.

    Attributes:
        batch_sizes: The batch buckets (:func:`capture_sizes`).
        widths: The table-width buckets (:func:`table_widths`).
        device_buffer: The persistent int64 input buffer (on ``device``).
        host_buffer: Its staging twin on the host (the same tensor on the CPU).
    """

    def __init__(self, model: Any, *, kv_caches: list[torch.Tensor], blocks_dim: int,
                 block_size: int, scratch_block_id: int, max_batch_size: int,
                 max_model_len: int, device: torch.device) -> None:
        import torch

        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block_id = scratch_block_id
        self.device = device
        self.batch_sizes = capture_sizes(max_batch_size)
        self.max_batch = self.batch_sizes[-1]
        self.max_width = max(1, num_blocks_for(max_model_len, block_size))
        self.widths = table_widths(self.max_width)
        rows = self.max_batch
        self._table_offset = 4 * rows
        size = self._table_offset + -(-rows * self.max_width // 2)
        on_host = device.type == "cpu"
        self.host_buffer = torch.zeros(size, dtype=torch.long,
                                       pin_memory=not on_host and platform.pins_memory(device))
        self.device_buffer = (self.host_buffer if on_host
                              else torch.zeros(size, dtype=torch.long, device=device))
        self._host_ints = self.host_buffer.numpy()  # (size,) int64 view for fast host writes
        self._host_tables = self.host_buffer[self._table_offset:].view(torch.int32).numpy()
        self.key_positions = torch.arange(self.max_width * block_size, device=device)
        self.attention = ReferenceDecode(blocks_dim=blocks_dim)
        self._views: dict[Bucket, tuple[torch.Tensor, ...]] = {}

    @property
    def buckets(self) -> list[Bucket]:
        """Every ``(rows, width)`` bucket, largest first (the capture order)."""
        return sorted(((b, w) for b in self.batch_sizes for w in self.widths),
                      key=lambda key: (key[0] * key[1], key[0]), reverse=True)

    def bucket(self, layout: BatchLayout) -> Bucket | None:
        """The bucket of a pure-decode ``layout``, or None (mixed step, too many rows or a
        context wider than the widest table: those run eagerly)."""
        if layout.num_decodes != layout.num_segments or layout.num_segments == 0:
            return None
        rows = bucket_for(layout.num_segments, self.batch_sizes)
        need = max(num_blocks_for(n, layout.block_size) for n in layout.seq_lens)
        width = bucket_for(need, self.widths)
        if rows is None or width is None:
            return None
        return rows, width

    def views(self, key: Bucket) -> tuple[torch.Tensor, ...]:
        """``(input_ids, positions, slot_mapping, block_tables, seq_lens, key_positions)`` of
        bucket ``key``: views of the persistent buffers, the same tensors at every step."""
        found = self._views.get(key)
        if found is None:
            import torch

            rows, width = key
            buf, n = self.device_buffer, self.max_batch
            tables = buf[self._table_offset:].view(torch.int32)[: rows * width].view(rows, width)
            found = (buf[0:rows], buf[n: n + rows], buf[2 * n: 2 * n + rows], tables,
                     buf[3 * n: 3 * n + rows], self.key_positions[: width * self.block_size])
            self._views[key] = found
        return found

    def stage(self, key: Bucket, layout: BatchLayout | None = None,
              input_ids: list[int] | None = None, positions: list[int] | None = None) -> None:
        """Write a step's inputs (or, with no ``layout``, padding only) into the host staging
        and copy them to the device in one non-blocking copy."""
        rows, width = key
        n, scratch = self.max_batch, self.scratch_block_id
        ints, tables = self._host_ints, self._host_tables
        real = 0 if layout is None else layout.num_segments
        if layout is not None:
            assert input_ids is not None and positions is not None
            ints[0:real] = input_ids
            ints[n: n + real] = positions
            ints[2 * n: 2 * n + real] = layout.slot_mapping
            ints[3 * n: 3 * n + real] = layout.seq_lens
        ints[real:rows] = 0
        ints[n + real: n + rows] = 0
        ints[2 * n + real: 2 * n + rows] = scratch * self.block_size
        ints[3 * n + real: 3 * n + rows] = 1
        tables[: rows * width] = scratch
        for row in range(real):
            assert layout is not None
            used = layout.block_tables[row][: num_blocks_for(layout.seq_lens[row], self.block_size)]
            tables[row * width: row * width + len(used)] = used
        if self.device_buffer is not self.host_buffer:
            words = self._table_offset + -(-rows * width // 2)
            self.device_buffer[:words].copy_(self.host_buffer[:words], non_blocking=True)

    def step_fn(self, input_ids: torch.Tensor, positions: torch.Tensor,
                slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                key_positions: torch.Tensor) -> torch.Tensor:
        """The static step: ``(B,)`` inputs (views of :meth:`views`) -> ``(B, V)`` logits.

        Writes each row's K/V at its slot; pure tensor code (module docstring).
        """
        metadata = DecodeMetadata(slot_mapping=slot_mapping, block_tables=block_tables,
                                  seq_lens=seq_lens, key_positions=key_positions)
        step = registry.PagedAttentionStep(self.attention, self.kv_caches,  # type: ignore[arg-type]
                                           metadata)
        out = self.model(input_ids=input_ids[None], position_ids=positions[None],
                         use_cache=False, **{registry.STEP_KWARG: step})
        return out.logits[0]  # (B, V)

    def run(self, key: Bucket) -> torch.Tensor:
        """The step at bucket ``key`` run eagerly over the staged inputs: ``(B, V)`` logits."""
        return self.step_fn(*self.views(key))
