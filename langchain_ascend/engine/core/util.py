"""Small helpers shared by the scheduling core and its neighbours (torch-free)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b`` in integers (blocks needed for ``a`` slots)."""
    return -(-a // b)
