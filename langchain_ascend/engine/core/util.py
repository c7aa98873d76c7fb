"""Small helpers shared by the scheduling core and its neighbours (torch-free)."""

from __future__ import annotations

from langchain_ascend.errors import InvalidRequestError


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b`` in integers (blocks needed for ``a`` slots)."""
    return -(-a // b)


def check_positive(*, allow_none: bool = True, **values: int | None) -> None:
    """Raise :class:`InvalidRequestError` naming the first value that is not a positive
    integer (None passes where ``allow_none``)."""
    for name, value in values.items():
        if value is None and allow_none:
            continue
        if not isinstance(value, int) or value <= 0:
            raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")
