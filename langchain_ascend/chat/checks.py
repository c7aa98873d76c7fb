"""Checks of a chat request's values, shared by the constructor and per-call arguments.

Each check raises a typed error naming the argument, the value and what is allowed:
:class:`~langchain_ascend.errors.InvalidArgumentTypeError` (a ``ValueError`` and a
``TypeError``) for a wrong type — a bool where a number is expected is a wrong type, not 1 —
and :class:`~langchain_ascend.errors.InvalidRequestError` for a value out of range. Which rule
applies to which field is said here; the rules themselves are :mod:`langchain_ascend.validation`'s.
No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_ascend.engine.core.sampling_params import (
    MAX_NUM_SPECULATIVE_TOKENS,
    MAX_SEED,
    SPECULATION_MODES,
    check_penalties,
)
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError, InvalidTextError
from langchain_ascend.validation import (
    as_items,
    check_choice,
    check_flag,
    check_int,
    check_number,
    check_probability,
    check_text,
)

REASONING_EFFORTS = ("low", "medium", "high")
"""The ``reasoning=`` effort levels (besides True / False / None)."""
BUDGET_CLOSED = ("cut", "complete")
"""``budget_closed_output=`` values (``AscendChatModel.budget_closed_output``)."""
MAX_TOKENS_OVERFLOW = ("cap", "error")
"""``max_tokens_overflow=`` values (per call): a ``max_tokens`` past the context's room is
capped to it, or refused with ``PromptTooLongError``."""


def check_sampling(values: Mapping[str, Any]) -> None:
    """Check the sampling values present in ``values`` (constructor fields or call kwargs).

    Raises:
        InvalidArgumentTypeError: A value of the wrong type (``max_tokens=True``,
            ``top_k=2.7``, ``temperature="0.5"``).
        InvalidRequestError: A value out of range (``max_tokens=0``, ``temperature=inf`` or
            NaN, ``top_p=0``, ``seed=-1`` or ``>= 2**63``, ``repetition_penalty=0``,
            ``presence_penalty=3``, ``min_p=2``, ``reasoning="max"``).
    """
    if "max_tokens" in values:
        check_int("max_tokens", values["max_tokens"], minimum=1, allow_none=True)
    if "temperature" in values:
        check_number("temperature", values["temperature"], minimum=0, allow_none=True)
    if "top_p" in values:
        check_probability("top_p", values["top_p"], open_min=True, allow_none=True)
    if "top_k" in values:
        check_int("top_k", values["top_k"], minimum=0, allow_none=True)
    if "seed" in values:
        check_int("seed", values["seed"], minimum=0, maximum=MAX_SEED, allow_none=True)
    if "num_speculative_tokens" in values:
        check_int("num_speculative_tokens", values["num_speculative_tokens"], minimum=0,
                  maximum=MAX_NUM_SPECULATIVE_TOKENS, allow_none=True)
    if values.get("speculative_decoding") is not None:
        check_choice("speculative_decoding", values["speculative_decoding"],
                     SPECULATION_MODES)
    if values.get("budget_closed_output") is not None:
        check_choice("budget_closed_output", values["budget_closed_output"], BUDGET_CLOSED)
    if values.get("max_tokens_overflow") is not None:
        check_choice("max_tokens_overflow", values["max_tokens_overflow"], MAX_TOKENS_OVERFLOW)
    check_flag("ignore_eos", values.get("ignore_eos"), allow_none=True)
    check_flag("stream_usage", values.get("stream_usage"), allow_none=True)
    check_penalties(values)
    reasoning = values.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, bool):
        check_choice("reasoning", reasoning, REASONING_EFFORTS + (True, False))


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
