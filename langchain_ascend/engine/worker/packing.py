"""A step's segments packed into one flat token batch (pure Python, no torch).

The attention backends see a :class:`~langchain_ascend.attention.backends.base.BatchLayout`:
single-token "decode" segments first, then the multi-token ones. A scheduled segment becomes
one or more of those layout segments ("pieces"):

* a single-token segment, and a multi-token one without drafts: one piece, as it is;
* a segment with drafted tokens (a speculative verify pass): each drafted token is a decode
  piece of its own over the segment's block table, at its position; the tokens before the
  drafts stay as they would run without drafts -- the last known token a decode piece when it
  is the only one, else all known tokens one multi-token piece. So query row ``i`` of a verify
  pass is computed exactly as the one-row decode at that position would be (same attention
  kernel, same key ranges, same per-row products): greedy text is the same with speculation
  on or off. The rows of one pass read the same blocks, which the CPU paged kernel reads once
  for all of them (``native/paged_attention.c``). Every piece's K/V is written before any
  attention of the layer, so a drafted row sees the rows before it;
* a segment's *output* tokens (positions at or past its prompt's length: a grammar's forced
  tokens appended by jump-forward, a forced call's opening text) are decode pieces too, at
  most :data:`MAX_OUTPUT_DECODE_ROWS` of them (more, as after a preemption, run as one
  multi-token piece with the prompt's; a segment that names no prompt, like the runner's
  own probes, keeps the rules above). Every generated token is then computed as the one-row
  decode at its position, whether it was sampled or forced, so jump-forward changes no
  logits, and a step of one sampled token plus a few forced ones is a pure-decode step the
  CPU decode stack takes (instead of a small prefill through the model's forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_ascend.attention.backends.base import BatchLayout
from langchain_ascend.engine.core.batch import ScheduledSegment


@dataclass(frozen=True)
class Piece:
    """Tokens ``offset .. offset + count - 1`` of segment ``segment``, one layout segment."""

    segment: int
    offset: int
    count: int


@dataclass(frozen=True)
class PackedStep:
    """A packed step.

    Attributes:
        layout: The attention backends' description.
        input_ids: The ``T`` packed tokens.
        positions: Their absolute positions.
        sample_rows: Packed rows whose logits are sampled, per sampling segment in ``order``:
            its last token, or a verify pass's last known token and each draft.
        sample_indices: The sampling segments' indices, in that order.
    """

    layout: BatchLayout
    input_ids: list[int]
    positions: list[int]
    sample_rows: list[int]
    sample_indices: list[int]


MAX_OUTPUT_DECODE_ROWS = 64
"""Most known output tokens of one segment packed as decode pieces (see the module docstring)."""


def first_decode_offset(seg: ScheduledSegment) -> int:
    """Offset in ``seg.token_ids`` of its first decode piece (``len(token_ids)``: none); the
    tokens before it are one multi-token piece (pure function)."""
    count = len(seg.token_ids)
    known = count - len(seg.draft_token_ids)
    outputs_from = max(0, len(seg.prompt_token_ids) - seg.start_pos)  # first output offset
    if (seg.prompt_token_ids and outputs_from < known
            and known - outputs_from <= MAX_OUTPUT_DECODE_ROWS):
        first = outputs_from  # known output tokens as decode rows
    else:
        first = known
    return 0 if first <= 1 else first  # a lone token before the decodes is a decode too


def pieces_of(segments: Sequence[ScheduledSegment], order: Sequence[int]) -> list[Piece]:
    """The layout segments of ``segments`` in ``order``: every decode piece first, then the
    multi-token pieces (see the module docstring; pure function)."""
    decodes: list[Piece] = []
    longer: list[Piece] = []
    for index in order:
        seg = segments[index]
        first_decode = first_decode_offset(seg)
        if first_decode > 0:
            longer.append(Piece(index, 0, first_decode))
        decodes.extend(Piece(index, offset, 1)
                       for offset in range(first_decode, len(seg.token_ids)))
    return decodes + longer


def pack(segments: Sequence[ScheduledSegment], block_size: int,
         order: Sequence[int]) -> PackedStep:
    """Pack ``segments`` (in ``order``) into one flat token batch (pure function).

    Raises:
        ValueError: A segment is empty or its block table does not cover its tokens.
    """
    for seg in segments:
        end = seg.start_pos + len(seg.token_ids)
        if not seg.token_ids:
            raise ValueError(f"request {seg.request_id!r}: scheduled segment has no tokens")
        if len(seg.block_ids) * block_size < end:
            raise ValueError(
                f"request {seg.request_id!r}: block table of {len(seg.block_ids)} blocks covers "
                f"{len(seg.block_ids) * block_size} slots, the segment needs {end}")
    pieces = pieces_of(segments, order)
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    row_of: dict[tuple[int, int], int] = {}  # (segment, first token) -> packed row
    for piece in pieces:
        seg = segments[piece.segment]
        start = seg.start_pos + piece.offset
        end = start + piece.count
        row_of[piece.segment, piece.offset] = query_start_loc[-1]
        input_ids.extend(seg.token_ids[piece.offset: piece.offset + piece.count])
        positions.extend(range(start, end))
        slot_mapping.extend(seg.block_ids[p // block_size] * block_size + p % block_size
                            for p in range(start, end))
        query_start_loc.append(query_start_loc[-1] + piece.count)
        seq_lens.append(end)
    layout = BatchLayout(query_start_loc=query_start_loc, seq_lens=seq_lens,
                         block_tables=[segments[p.segment].block_ids for p in pieces],
                         slot_mapping=slot_mapping,
                         num_decodes=sum(1 for p in pieces if p.count == 1),
                         block_size=block_size)
    sample_indices = [i for i in order if segments[i].sample]
    sample_rows: list[int] = []
    for index in sample_indices:
        count = len(segments[index].token_ids)
        for token in range(count - 1 - len(segments[index].draft_token_ids), count):
            first = row_of.get((index, token))
            sample_rows.append(row_of[index, 0] + token if first is None else first)
    return PackedStep(layout, input_ids, positions, sample_rows, sample_indices)


def build_layout(segments: Sequence[ScheduledSegment], block_size: int,
                 order: Sequence[int]) -> tuple[BatchLayout, list[int], list[int]]:
    """``(layout, input_ids, positions)`` of :func:`pack` (pure function)."""
    packed = pack(segments, block_size, order)
    return packed.layout, packed.input_ids, packed.positions
