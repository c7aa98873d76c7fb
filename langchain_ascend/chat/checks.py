"""Checks of a chat request's values, shared by the constructor and per-call arguments.

Each check raises a typed error naming the argument, the value and what is allowed:
:class:`~langchain_ascend.errors.InvalidArgumentTypeError` (a ``ValueError`` and a
``TypeError``) for a wrong type — a bool where a number is expected is a wrong type, not 1 —
and :class:`~langchain_ascend.errors.InvalidRequestError` for a value out of range. No torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_ascend.engine.core.sampling_params import (
    MAX_NUM_SPECULATIVE_TOKENS,
    SPECULATION_MODES,
)
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError, InvalidTextError
from langchain_ascend.index.checks import as_items, check_text

#: Largest ``seed``: the engine seeds a 64-bit generator.
MAX_SEED = 2**63 - 1

DTYPE_NAMES = frozenset(
    {"auto", "float32", "fp32", "float", "bfloat16", "bf16", "float16", "fp16", "half"})
_DEVICE_RE = re.compile(r"^(auto|cpu|(npu|cuda)(:\d+)?)$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> None:
    """``value`` is None or an int (not a bool) in ``[minimum, maximum]``."""
    if value is None:
        return
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if not _is_int(value):
        raise InvalidArgumentTypeError(
            f"{name} must be an integer {bound} or None, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidRequestError(f"{name} must be an integer {bound}, got {value!r}")


def check_float(name: str, value: Any, *, minimum: float, maximum: float | None = None,
                open_min: bool = False) -> None:
    """``value`` is None or a finite number (not a bool) within the bounds."""
    if value is None:
        return
    low = "(" if open_min else "["
    bound = f"in {low}{minimum}, {maximum}]" if maximum is not None else (
        f"> {minimum}" if open_min else f">= {minimum}")
    if not _is_number(value):
        raise InvalidArgumentTypeError(
            f"{name} must be a finite number {bound} or None, got {type(value).__name__} "
            f"{value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    below = number <= minimum if open_min else number < minimum
    if not math.isfinite(number) or below or (maximum is not None and number > maximum):
        raise InvalidRequestError(f"{name} must be a finite number {bound}, got {value!r}")


def check_sampling(values: Mapping[str, Any]) -> None:
    """Check the sampling values present in ``values`` (constructor fields or call kwargs).

    Raises:
        InvalidArgumentTypeError: A value of the wrong type (``max_tokens=True``,
            ``top_k=2.7``, ``temperature="0.5"``).
        InvalidRequestError: A value out of range (``max_tokens=0``, ``temperature=inf`` or
            NaN, ``top_p=0``, ``seed=-1`` or ``>= 2**63``).
    """
    if "max_tokens" in values:
        check_int("max_tokens", values["max_tokens"], minimum=1)
    if "temperature" in values:
        check_float("temperature", values["temperature"], minimum=0.0)
    if "top_p" in values:
        check_float("top_p", values["top_p"], minimum=0.0, maximum=1.0, open_min=True)
    if "top_k" in values:
        check_int("top_k", values["top_k"], minimum=0)
    if "seed" in values:
        check_int("seed", values["seed"], minimum=0, maximum=MAX_SEED)
    if "num_speculative_tokens" in values:
        check_int("num_speculative_tokens", values["num_speculative_tokens"], minimum=0,
                  maximum=MAX_NUM_SPECULATIVE_TOKENS)
    mode = values.get("speculative_decoding")
    if mode is not None and mode not in SPECULATION_MODES:
        raise InvalidRequestError(
            f"speculative_decoding must be one of {list(SPECULATION_MODES)}, got {mode!r}")
    if values.get("ignore_eos") is not None and not isinstance(values["ignore_eos"], bool):
        raise InvalidArgumentTypeError(
            f"ignore_eos must be True or False, got {values['ignore_eos']!r}")


def check_device_spelling(device: Any, error: type[Exception] = InvalidRequestError) -> None:
    """``device`` is spelled ``auto``/``cpu``/``npu[:N]``/``cuda[:N]`` (``"cpu:1"`` is not)."""
    if not isinstance(device, str) or not _DEVICE_RE.match(device.strip().lower()):
        raise error(
            f"device={device!r} is not a device: use 'auto', 'cpu', 'npu', 'npu:N', 'cuda' "
            "or 'cuda:N' (the CPU has no index)")


def check_device_dtype(device: Any, dtype: Any) -> None:
    """``device`` is ``auto``/``cpu``/``npu[:N]``/``cuda[:N]`` and ``dtype`` a known name.

    Only the spelling is checked here; whether the device exists is known when the engine
    loads (``DeviceUnavailableError``)."""
    check_device_spelling(device)
    key = str(dtype).lower().removeprefix("torch.")
    if not isinstance(dtype, str) or key not in DTYPE_NAMES:
        raise InvalidRequestError(
            f"dtype={dtype!r} is not supported: use 'auto', 'float32', 'bfloat16' or 'float16'")


def stop_list(stop: Any, name: str = "stop") -> list[str] | None:
    """Stop strings as a list: one string is one stop (``stop="###"``), never its letters.

    Raises:
        InvalidArgumentTypeError: Not a string or a list of non-empty strings.
    """
    items = as_items(name, stop, str_is_item=True, error=InvalidArgumentTypeError,
                     allow_none=True)
    if items is None:
        return None
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise InvalidArgumentTypeError(
                f"{name}[{i}] must be a non-empty string, got {item!r}")
    return items


def check_conversation_text(messages: Sequence[Mapping[str, Any]]) -> None:
    """The rendered conversation holds some text, and only encodable text.

    Raises:
        InvalidRequestError: Every message is empty or whitespace (``""``, ``"   "``) and
            none carries a tool call.
        InvalidTextError: A lone surrogate in a message; names the message and position.
    """
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            check_text(f"messages[{i}].content", content, InvalidTextError)
    if all(_blank(m) for m in messages):
        raise InvalidRequestError(
            "the prompt is empty: every message's content is empty or whitespace "
            f"({[m.get('content') for m in messages][:3]!r}); give some text")


def _blank(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    text = content if isinstance(content, str) else str(content or "")
    return not text.strip() and not message.get("tool_calls")
