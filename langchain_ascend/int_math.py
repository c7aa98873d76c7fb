"""Integer helpers shared across layers (a leaf: imports nothing of the package)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b`` in integers (blocks needed for ``a`` slots)."""
    return -(-a // b)
