"""Argument checks shared by the chat model, the index, embeddings and the tool executor:
numbers (:func:`check_number`), sequence parameters (:func:`as_items`) and text
(:func:`check_text`).

The sequence rule: where a list is expected, a bare ``str`` is never iterated character by
character. It is one item where that reading is unambiguous (``stop="###"``,
``delete("doc-1")``, ``get_by_ids("doc-1")``), and a typed error where a string is surely a
mistake (``embed_documents("text")``: use ``embed_query``; ``add_texts("text")``).

Each caller names the error type its callers expect (``ValueError`` for the index and the
embedding batcher, :class:`~langchain_ascend.errors.InvalidRequestError` for the executor,
:class:`~langchain_ascend.errors.VectorStoreInputError` for a search's ``k``). Booleans are
refused even though Python counts them as integers.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
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


def as_items(name: str, value: Any, *, str_is_item: bool, error: type[Exception] = TypeError,
             allow_none: bool = False, what: str = "a list") -> list[Any] | None:
    """``value`` as a list: a bare ``str`` (or ``bytes``) becomes ``[value]`` with
    ``str_is_item``, else ``error``; a mapping or a non-iterable is ``error``.

    The message reads ``"texts must be a list of strings, got the str 'abc'; wrap..."``.
    """
    if value is None:
        if allow_none:
            return None
        raise error(f"{name} must be {what}, got None")
    if isinstance(value, (str, bytes)):
        if str_is_item:
            return [value]
        raise error(f"{name} must be {what}, got the {type(value).__name__} "
                    f"{_short(value)}; wrap one item in a list ([...])")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise error(f"{name} must be {what}, got {type(value).__name__} {_short(value)}")
    return list(value)


def check_text(name: str, text: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``name`` and the position when ``text`` cannot be encoded as
    UTF-8 (a lone surrogate); a tokenizer would otherwise fail with a bare ``TypeError``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{name} holds a character that is not valid Unicode text "
                    f"({text[exc.start]!r}, a lone surrogate) at position {exc.start}; "
                    "only encodable text is allowed (decode bytes with errors='replace')"
                    ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_store_number(name: str, value: Any, *, minimum: float, maximum: float | None = None,
                       integer: bool = True, allow_none: bool = False) -> None:
    """A vector-store option: a wrong type (``k="3"``, ``k=None``, ``k=True``) raises
    ``VectorStoreArgumentTypeError``, a value out of ``[minimum, maximum]`` (``k=-1``,
    ``fetch_k=0``, ``lambda_mult=5``) ``VectorStoreInputError``; both name it and the value."""
    import math

    from langchain_ascend.errors import VectorStoreArgumentTypeError, VectorStoreInputError

    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    what = "an integer" if integer else "a number"
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if not isinstance(value, kind) or isinstance(value, bool):
        raise VectorStoreArgumentTypeError(
            f"{name} must be {what} {bound}, got {type(value).__name__} {_short(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if (not math.isfinite(number) or number < minimum
            or (maximum is not None and number > maximum)):
        raise VectorStoreInputError(f"{name} must be {what} {bound}, got {value!r}")
