"""Which bytes the ``"x8"`` block layout moves where (``quant.formats`` owns the formats and
the layout; this module only lists the fields of a block of each format the layout takes and
builds the numpy record types that re-lay them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_X8_FIELDS = {
    "q4_0": (("head", "<u2", 1), ("values", "<u4", 4)),
    "q4_1": (("head", "<u2", 2), ("values", "<u4", 4)),
    "q8_0": (("head", "<u2", 1), ("values", "<u4", 8)),
    "q4_k": (("head", "<u2", 2), ("scales", "<u4", 3), ("qs", "<u4", 32)),
    "q5_k": (("head", "<u2", 2), ("scales", "<u4", 3), ("qh", "<u4", 8), ("qs", "<u4", 32)),
    "q6_k": (("ql0", "<u4", 8), ("ql1", "<u4", 8), ("ql2", "<u4", 8), ("ql3", "<u4", 8),
             ("qh0", "<u4", 8), ("qh1", "<u4", 8), ("scales", "i1", 16), ("head", "<u2", 1)),
}
"""The fields of one block of each ``quant.formats.X8_LAYOUT_FORMATS`` format, in the file's
order, as (name, element type, count): what the ``"x8"`` layout interleaves by 8 rows element
by element (``quant.formats``' docstring)."""
_X8_ORDER = {"q6_k": ("head", "scales", "ql0", "qh0", "ql1", "ql2", "qh1", "ql3")}
"""The order of the fields in an ``"x8"`` superblock where it is not the file's: ``q6_k``'s
in the order its product reads them (scales first, then each half's values with their high
bits), so the weight streams forwards."""


def block_dtypes(fmt: str, rows: int) -> tuple[np.dtype, np.dtype]:
    """numpy record types of one row's block (``"gguf"``) and of one ``"x8"`` superblock of
    ``rows`` rows of ``fmt`` (:data:`_X8_FIELDS`: ``row[name][i]`` is element ``i`` of a field,
    ``superblock[name][i, r]`` that element of row ``r``, the fields in :data:`_X8_ORDER`)."""
    import numpy as np

    fields = {name: (kind, count) for name, kind, count in _X8_FIELDS[fmt]}
    row = np.dtype([(name, kind, (count,)) for name, (kind, count) in fields.items()])
    order = _X8_ORDER.get(fmt, tuple(fields))
    superblock = np.dtype([(name, fields[name][0], (fields[name][1], rows)) for name in order])
    return row, superblock


def field_table(fmt: str) -> list[tuple[int, int, int, int]]:
    """``(source offset, element bytes, count, destination offset)`` of each field of
    ``fmt``'s block (:data:`_X8_FIELDS`): where it starts in a row's block, and where its
    8-row interleaved elements start in an ``"x8"`` superblock (:func:`block_dtypes`) -- what
    the native re-laying (``native/block_layout.c``) moves."""
    row, superblock = block_dtypes(fmt, 8)
    table = []
    for name, _kind, count in _X8_FIELDS[fmt]:
        base = row.fields[name][0].base
        table.append((row.fields[name][1], base.itemsize, count, superblock.fields[name][1]))
    return table
