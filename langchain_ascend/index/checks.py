"""One argument check for numeric options, shared by the index, embeddings and tool executor.

Each caller names the error type its callers expect (``ValueError`` for the index and the
embedding batcher, :class:`~langchain_ascend.errors.InvalidRequestError` for the executor,
:class:`~langchain_ascend.errors.VectorStoreInputError` for a search's ``k``). Booleans are
refused even though Python counts them as integers.
"""

from __future__ import annotations

import numbers
from typing import Any


def check_number(name: str, value: Any, *, minimum: float, allow_none: bool = False,
                 integer: bool = False, strict: bool = False,
                 error: type[Exception] = ValueError) -> None:
    """Raise ``error`` unless ``value`` is a number (an integer with ``integer``) ``>= minimum``
    (``> minimum`` with ``strict``), or None with ``allow_none``.

    The message reads ``"{name} must be an integer >= 1 or None; got 0"``.
    """
    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        what = "an integer" if integer else "a number"
        extra = " or None" if allow_none else ""
        raise error(f"{name} must be {what} {bound}{extra}; got {value!r}")
