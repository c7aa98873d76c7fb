"""Token masks packed like xgrammar's bitmask: ``(ceil(V/32),) int32`` words, bit ``i % 32`` of
word ``i // 32`` is token ``i`` -- so a grammar step's mask work is a few word-wise
operations, and a logits row is masked without unpacking the words into a bool array.
Pure functions over numpy arrays.
"""

from __future__ import annotations

import numpy as np


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Pack a ``(V,)`` bool array into xgrammar's ``(ceil(V/32),) int32`` layout."""
    num_words = (mask.shape[0] + 31) // 32
    padded = np.zeros(num_words * 32, dtype=bool)  # (W*32,)
    padded[: mask.shape[0]] = mask
    return np.packbits(padded, bitorder="little").view(np.int32)  # (W,)


def unpack_mask(packed: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack ``(W,) int32`` words into a ``(V,)`` bool array."""
    return np.unpackbits(packed.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


DENSE_MASK_FRACTION = 0.9
"""Allowed share of the vocabulary from which xgrammar's kernel masks a row (it visits the
disallowed tokens one by one: ~10 us for a nearly open mask, ~200 us for a sparse one)."""


def set_bit_ids(packed: np.ndarray, limit: int) -> np.ndarray:
    """Ids below ``limit`` of the set bits of a packed ``(W,)`` mask, ascending (only the
    words with a bit set are unpacked)."""
    words = np.flatnonzero(packed)  # (K,)
    if words.size == 0:
        return words
    bits = np.unpackbits(packed[words].view(np.uint8), bitorder="little").reshape(-1, 32)
    ids = (words[:, None] * 32 + np.arange(32))[bits.astype(bool)]  # (N,)
    return ids[ids < limit]


def mask_row(row: np.ndarray, packed: np.ndarray, width: int) -> bool:
    """``row[t] = -inf`` for every token ``t < width`` whose bit in ``packed`` ``(W,)`` is
    clear, in place, where the mask is sparse enough that this beats xgrammar's kernel: the
    allowed values are kept, the row filled, the kept values put back (~20-30 us a 49k row
    with a few hundred allowed, one thread). Returns False, changing nothing, for a mask
    with more than :data:`DENSE_MASK_FRACTION` of the row allowed."""
    kept = set_bit_ids(packed, width)  # (A,) allowed token ids
    if len(kept) > DENSE_MASK_FRACTION * width:
        return False
    values = row[kept]  # (A,)
    row[:width] = -np.inf
    row[kept] = values
    return True


def set_bit(packed: np.ndarray, token_id: int) -> None:
    """Allow ``token_id`` in the packed mask, in place."""
    packed.view(np.uint32)[token_id // 32] |= np.uint32(1 << (token_id % 32))


def has_bit(packed: np.ndarray, token_id: int) -> bool:
    """Whether ``token_id`` is allowed in the packed mask."""
    return bool(packed.view(np.uint32)[token_id // 32] >> np.uint32(token_id % 32) & 1)


def clear_bit(packed: np.ndarray, token_id: int) -> None:
    """Disallow ``token_id`` in the packed mask, in place."""
    packed.view(np.uint32)[token_id // 32] &= ~np.uint32(1 << (token_id % 32))
