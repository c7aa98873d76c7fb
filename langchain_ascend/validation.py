"""One rule per kind of argument value, for every component (no torch, no components).

The chat model, the engine, the vector store, the embeddings and the tool executor check
their arguments here, so a kind of value means the same everywhere: an integer is never a
``bool`` (``max_batch_size=True`` is a mistake, not a one), a number is finite, a flag is
exactly ``True`` or ``False``, a bare ``str`` is one item or an error, never iterated by
character. Each rule raises the caller's :class:`Errors`: :data:`REQUEST` (chat model,
engine, tool executor, agent) or :data:`STORE` (vector store, embeddings), every one a
``ValueError`` (the type errors ``TypeError`` s too). Messages name the argument, what is
allowed and the value: ``"top_p must be a finite number in (0, 1], got 0"``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_ascend.errors import (
    InvalidArgumentTypeError,
    InvalidRequestError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)

__all__ = [
    "REQUEST",
    "STORE",
    "Errors",
    "as_items",
    "check_choice",
    "check_count",
    "check_device",
    "check_dtype",
    "check_flag",
    "check_int",
    "check_number",
    "check_probability",
    "check_text",
    "int_bounds",
    "is_int",
    "is_number",
    "number_bounds",
]


@dataclass(frozen=True)
class Errors:
    """The error classes a component raises for bad arguments.

    Attributes:
        type: Raised for a value of the wrong type (``k="3"``, ``max_tokens=True``).
        value: Raised for a value of the right type out of range (``k=-1``, ``top_p=0``).
    """

    type: type[Exception]
    value: type[Exception]


DTYPE_NAMES = frozenset(
    {"auto", "float32", "fp32", "float", "bfloat16", "bf16", "float16", "fp16", "half"})
"""The dtype names every component takes (``torch.`` prefixes and case aside)."""
_DTYPE_SPELLINGS = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                    "half": "float16"}
_DEVICE_RE = re.compile(r"^(auto|cpu|(npu|cuda)(:\d+)?)$")


def canonical_dtype(dtype: str) -> str:
    """A name of :data:`DTYPE_NAMES` as the config file spells it (``"bf16"`` ->
    ``"bfloat16"``, ``"torch.float16"`` -> ``"float16"``); checked by :func:`check_dtype`."""
    name = dtype.strip().lower().removeprefix("torch.")
    return _DTYPE_SPELLINGS.get(name, name)

REQUEST = Errors(InvalidArgumentTypeError, InvalidRequestError)
"""The chat model's, the engine's, the tool executor's and the agent's errors."""

STORE = Errors(VectorStoreArgumentTypeError, VectorStoreInputError)
"""The vector store's and the embeddings' errors."""


def is_int(value: Any) -> bool:
    """True for a real integer (``int``, numpy integers), False for a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for an int or float (any ``numbers.Real``), False for a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """``type value`` for a message, the repr cut at 60 characters."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def int_bounds(minimum: int | None, maximum: int | None) -> str:
    """``"an integer >= 1"``, ``"an integer in [0, 16]"``, ``"an integer <= 8"``."""
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def number_bounds(minimum: float | None, maximum: float | None, *, open_min: bool = False,
                  open_max: bool = False) -> str:
    """``"a finite number >= 0"``, ``"a finite number in (0, 1]"``, ``"a finite number > 0"``."""
    if minimum is not None and maximum is not None:
        return (f"a finite number in {'(' if open_min else '['}{minimum}, "
                f"{maximum}{')' if open_max else ']'}")
    if minimum is not None:
        return f"a finite number {'>' if open_min else '>='} {minimum}"
    if maximum is not None:
        return f"a finite number {'<' if open_max else '<='} {maximum}"
    return "a finite number"


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None, allow_none: bool = False, errors: Errors = REQUEST,
              what: str | None = None) -> Any:
    """An integer (never a ``bool``) in ``[minimum, maximum]``, or None with ``allow_none``.

    Args:
        name: The argument's name, for the message.
        value: The value to check.
        minimum: Smallest allowed value (None: no bound).
        maximum: Largest allowed value (None: no bound).
        allow_none: None passes (it means "the default").
        errors: The component's error classes.
        what: What is allowed, in words, instead of the bounds (``"0 (off) or a positive
            integer"``).

    Returns:
        ``value`` unchanged.

    Raises:
        errors.type: Not an integer (a bool, a float, a string...).
        errors.value: Out of range.
    """
    if value is None and allow_none:
        return value
    allowed = what or int_bounds(minimum, maximum)
    if allow_none and what is None:
        allowed += " or None"
    if not is_int(value):
        raise errors.type(f"{name} must be {allowed}, got {_shown(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise errors.value(f"{name} must be {allowed}, got {value!r}")
    return value


def check_count(name: str, value: Any, *, allow_none: bool = False,
                errors: Errors = REQUEST) -> Any:
    """A count: an integer ``>= 1`` (``True`` is refused), or None with ``allow_none``.

    Returns ``value``; raises as :func:`check_int`.
    """
    return check_int(name, value, minimum=1, allow_none=allow_none, errors=errors)


def check_number(name: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, open_min: bool = False, open_max: bool = False,
                 allow_none: bool = False, errors: Errors = REQUEST,
                 what: str | None = None) -> Any:
    """A finite int or float (never a ``bool``) within the bounds, or None with
    ``allow_none``; ``open_min`` / ``open_max`` exclude the bound itself.

    Returns:
        ``value`` unchanged.

    Raises:
        errors.type: Not a number (a bool, a string...).
        errors.value: NaN, infinite, or out of the bounds.
    """
    if value is None and allow_none:
        return value
    allowed = what or number_bounds(minimum, maximum, open_min=open_min, open_max=open_max)
    if allow_none and what is None:
        allowed += " or None"
    if not is_number(value):
        raise errors.type(f"{name} must be {allowed}, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    below = minimum is not None and (number <= minimum if open_min else number < minimum)
    above = maximum is not None and (number >= maximum if open_max else number > maximum)
    if not math.isfinite(number) or below or above:
        raise errors.value(f"{name} must be {allowed}, got {value!r}")
    return value


def check_probability(name: str, value: Any, *, open_min: bool = False,
                      allow_none: bool = False, errors: Errors = REQUEST) -> Any:
    """A share or probability: a finite number in ``[0, 1]`` (``(0, 1]`` with ``open_min``).

    Returns ``value``; raises as :func:`check_number`.
    """
    return check_number(name, value, minimum=0, maximum=1, open_min=open_min,
                        allow_none=allow_none, errors=errors)


def check_flag(name: str, value: Any, *, allow_none: bool = False,
               errors: Errors = REQUEST) -> Any:
    """Exactly ``True`` or ``False`` (or None with ``allow_none``); ``1`` and ``"yes"`` are
    refused with ``errors.type``. Returns ``value``."""
    if isinstance(value, bool) or (value is None and allow_none):
        return value
    raise errors.type(f"{name} must be True or False{' or None' if allow_none else ''}, got "
                      f"{_shown(value)}")


def check_choice(name: str, value: Any, choices: Collection[Any], *,
                 errors: Errors = REQUEST) -> Any:
    """One of ``choices`` (compared with ``==``; a ``bool`` never stands for ``1``/``0``);
    anything else raises ``errors.value`` listing them. Returns ``value``."""
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in choices):
        found = False
    else:
        try:
            found = value in choices
        except TypeError:  # an unhashable value against a set
            found = False
    if not found:
        raise errors.value(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def as_items(name: str, value: Any, *, str_is_item: bool, error: type[Exception],
             allow_none: bool = False, what: str = "a list") -> list[Any] | None:
    """``value`` as a list: a bare ``str`` (or ``bytes``) is ``[value]`` with ``str_is_item``,
    else ``error``; a mapping, a non-iterable or None (unless ``allow_none``) is ``error``.

    The message reads ``"texts must be a list of strings, got the str 'abc'; wrap..."``.
    """
    if value is None:
        if allow_none:
            return None
        raise error(f"{name} must be {what}, got None")
    if isinstance(value, (str, bytes)):
        if str_is_item:
            return [value]
        raise error(f"{name} must be {what}, got the {_shown(value)}; wrap one item in a "
                    "list ([...])")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise error(f"{name} must be {what}, got {_shown(value)}")
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


def check_device(device: Any, *, errors: Errors = REQUEST) -> Any:
    """``device`` is spelled ``auto``/``cpu``/``npu[:N]``/``cuda[:N]`` (``"cpu:1"`` is not: the
    CPU has no index); anything else raises ``errors.value``. Returns ``device``."""
    if not isinstance(device, str) or not _DEVICE_RE.match(device.strip().lower()):
        raise errors.value(
            f"device={device!r} is not a device: use 'auto', 'cpu', 'npu', 'npu:N', 'cuda' "
            "or 'cuda:N' (the CPU has no index)")
    return device


def check_dtype(dtype: Any, *, errors: Errors = REQUEST) -> Any:
    """``dtype`` is one of :data:`DTYPE_NAMES` (a string; ``"torch.float16"`` too); anything
    else raises ``errors.value``. Returns ``dtype``."""
    if not isinstance(dtype, str) or dtype.lower().removeprefix("torch.") not in DTYPE_NAMES:
        raise errors.value(
            f"dtype={dtype!r} is not supported: use 'auto', 'float32', 'bfloat16' or 'float16'")
    return dtype
