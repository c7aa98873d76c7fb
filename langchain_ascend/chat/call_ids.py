"""Tool call ids: random ones, or ones that repeat with the conversation. Pure Python."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from array import array
from collections.abc import Callable, Sequence

__all__ = ["new_tool_call_id", "reply_call_ids"]


def new_tool_call_id() -> str:
    """Return a fresh OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def reply_call_ids(prompt_token_ids: Sequence[int]) -> Callable[[], str]:
    """An id factory for one reply: ``call_`` + 24 hex digits of a hash of the prompt and the
    call's index in the reply (pure function).

    The same conversation gets the same ids, so a greedy agent run is repeatable end to end
    (the ids are written into the next hop's prompt); different prompts get different ids.
    """
    digest = hashlib.sha256(array("q", prompt_token_ids).tobytes()).hexdigest()
    counter = itertools.count()

    def next_id() -> str:
        return "call_" + hashlib.sha256(f"{digest}:{next(counter)}".encode()).hexdigest()[:24]

    return next_id
