"""Token ids to text, one token at a time, with stop strings. Pure Python, no torch.

Decoding each new token on its own breaks multi-byte characters (a Chinese character is often
two or three byte-level tokens) and word-initial spaces of SentencePiece vocabularies. We keep
a small window instead: ``prefix`` (tokens already turned into text, kept for context) and the
tokens read since; the new text is ``decode(prefix + new) - decode(prefix)``. While that ends
in an incomplete character (U+FFFD) nothing is emitted.

Stop strings are searched in the decoded text, so one that spans several tokens is caught. The
text from the stop string on is dropped. Text that could still turn into a stop string (a
suffix that is a prefix of one) is held back from streamed deltas until it is resolved.

Special tokens are dropped from the text, except the ones a request keeps (tool-call and
reasoning markers its reply parser reads, :class:`TextDecoder`): a marker is text whether it
was sampled, drafted or forced by a grammar, and whether the reply streams or not.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

_REPLACEMENT = "\ufffd"
# More tokens than this pending while the text still ends in U+FFFD: the bytes are really
# invalid, not an unfinished character (UTF-8 characters have at most 4 bytes), so emit them.
_MAX_PENDING_TOKENS = 4


def special_tokens_of(tokenizer: Any) -> dict[str, int]:
    """Every special token of ``tokenizer``, text -> id: the named ones (``all_special_tokens``)
    and the added tokens marked special, which ``decode(skip_special_tokens=True)`` drops too
    even when no named attribute lists them (a tool-tuned vocabulary's ``<tool_call>``)."""
    found = {str(token): int(idx) for token, idx in
             zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=False)}
    added: Mapping[int, Any] = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for idx, token in added.items():
        if getattr(token, "special", False):
            found.setdefault(str(token.content), int(idx))
    return found


class TextDecoder:
    """Token ids to text: special tokens dropped, except the ids in ``keep``.

    Args:
        tokenizer: A Hugging Face tokenizer (only ``decode`` is used).
        keep: Special-token ids decoded as their text (markers a reply parser reads).
        special_ids: Every special id of the tokenizer (:func:`special_tokens_of`'s values);
            needed only with ``keep``.
    """

    def __init__(self, tokenizer: Any, keep: Collection[int] = (),
                 special_ids: Collection[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._drop = frozenset(special_ids) - frozenset(keep) if keep else None

    def __call__(self, ids: Sequence[int]) -> str:
        if self._drop is None:
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        kept = [t for t in ids if t not in self._drop]
        return self._tokenizer.decode(kept, skip_special_tokens=False)


class IncrementalDetokenizer:
    """Text of one request's generated tokens, built incrementally.

    Args:
        decode: Token ids to text (a :class:`TextDecoder`).
        stop: Stop strings.

    Attributes:
        stop_string: The stop string found, once one is.
    """

    def __init__(self, decode: TextDecoder, stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = tuple(stop)
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""
        self._num_emitted = 0
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """All text decoded so far, cut before a stop string once one was found."""
        return self._text

    @property
    def token_ids(self) -> list[int]:
        return self._ids

    def add_token(self, token_id: int) -> None:
        """Decode one more token (ignored once a stop string was found)."""
        if self.stop_string is not None:
            return
        self._ids.append(token_id)
        self._append(self._read_new_text(final=False))

    def finish(self) -> None:
        """Flush bytes held back as an incomplete character (they decode to U+FFFD)."""
        if self.stop_string is None and self._read_offset < len(self._ids):
            self._append(self._read_new_text(final=True))

    def take_delta(self, *, final: bool = False) -> str:
        """Text not yet handed out, minus a tail that may still become a stop string."""
        end = len(self._text)
        if not final and self.stop_string is None:
            end -= self._held_back()
        delta = self._text[self._num_emitted:end]
        self._num_emitted = max(self._num_emitted, end)
        return delta

    def _read_new_text(self, *, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        pending = len(self._ids) - self._read_offset
        if not final and (len(full_text) <= len(prefix_text)
                          or (full_text.endswith(_REPLACEMENT)
                              and pending < _MAX_PENDING_TOKENS)):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text):]

    def _append(self, new_text: str) -> None:
        if not new_text:
            return
        search_from = max(0, len(self._text) - self._max_stop_len + 1)
        self._text += new_text
        if not self._stops:
            return
        found_at, found = len(self._text) + 1, None
        for stop in self._stops:
            index = self._text.find(stop, search_from)
            if index != -1 and index < found_at:
                found_at, found = index, stop
        if found is not None:
            self._text = self._text[:found_at]
            self.stop_string = found

    def _held_back(self) -> int:
        """Length of the longest unemitted suffix that is a proper prefix of a stop string."""
        longest = min(self._max_stop_len - 1, len(self._text) - self._num_emitted)
        for size in range(longest, 0, -1):
            tail = self._text[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
