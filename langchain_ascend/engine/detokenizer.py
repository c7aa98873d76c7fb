"""Token ids to text, one token at a time, with stop strings. Pure Python, no torch.

Decoding each new token on its own breaks multi-byte characters (a Chinese character is often
two or three byte-level tokens) and word-initial spaces of SentencePiece vocabularies. We keep
a small window instead: ``prefix`` (tokens already turned into text, kept for context) and the
tokens read since; the new text is ``decode(prefix + new) - decode(prefix)``. While that ends
in an incomplete character (U+FFFD) nothing is emitted.

A fast tokenizer whose ``decode`` is the ``tokenizers`` library's own (no clean-up of spaces,
no override) runs that window in Rust: ``tokenizers.decoders.DecodeStream`` (the same rule;
on SmolLM2's tokenizer a token costs ~42 us instead of ~121 us through two Python-side
``decode`` calls, stop-string checks included; 2-core CPU).
Other tokenizers use the window in Python, and so does a request from the point the stream
cannot take it (bytes still invalid after ``_MAX_PENDING_TOKENS`` tokens, a prefix the stream
refuses); the text is the same either way.

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

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

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


def stream_backend(tokenizer: Any) -> Tokenizer | None:
    """The ``tokenizers.Tokenizer`` a ``DecodeStream`` can step for ``tokenizer``, or None
    when its ``decode`` does more than the library's (clean-up of spaces, an override of
    ``_decode``, a slow tokenizer): the stream would then give other text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer) or getattr(tokenizer, "clean_up_tokenization_spaces",
                                                     False):
        return None
    owner = next((cls for cls in type(tokenizer).__mro__ if "_decode" in vars(cls)), None)
    return backend if owner is not None and owner.__name__ == "TokenizersBackend" else None


class TextDecoder:
    """Token ids to text: special tokens dropped, except the ids in ``keep``.

    Args:
        tokenizer: A Hugging Face tokenizer (only ``decode`` is used, and its
            ``backend_tokenizer`` for streams).
        keep: Special-token ids decoded as their text (markers a reply parser reads).
        special_ids: Every special id of the tokenizer (:func:`special_tokens_of`'s values);
            needed only with ``keep``.
        streaming: Let :class:`IncrementalDetokenizer` use ``DecodeStream`` where the
            tokenizer allows it (:func:`stream_backend`); False: the Python window always.
    """

    def __init__(self, tokenizer: Any, keep: Collection[int] = (),
                 special_ids: Collection[int] = (), *, streaming: bool = True) -> None:
        self._tokenizer = tokenizer
        self._drop = frozenset(special_ids) - frozenset(keep) if keep else None
        self.backend = stream_backend(tokenizer) if streaming else None

    def __call__(self, ids: Sequence[int]) -> str:
        if self._drop is None:
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        kept = [t for t in ids if t not in self._drop]
        return self._tokenizer.decode(kept, skip_special_tokens=False)

    def drops(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token left out of the text although others are
        kept (with ``keep`` only; without, the decode itself skips every special)."""
        return self._drop is not None and token_id in self._drop

    def stream(self) -> DecodeStream | None:
        """A new ``DecodeStream``, or None when this tokenizer cannot stream."""
        if self.backend is None:
            return None
        return DecodeStream(skip_special_tokens=self._drop is None)


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
        self._stream = decode.stream()
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
        if self._stream is not None:
            self._append(self._step_stream(token_id))
        else:
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

    def _step_stream(self, token_id: int) -> str:
        """The new text of ``token_id`` through the ``DecodeStream``: it emits when
        :meth:`_read_new_text` would (same window, same U+FFFD rule), and the offsets follow
        it. Bytes still invalid after ``_MAX_PENDING_TOKENS`` tokens, or a stream error: the
        Python window from then on (a stream started after invalid bytes drops its context:
        measured on tokenizers 0.23, it re-emits them)."""
        if self._decode.drops(token_id):
            return ""
        assert self._stream is not None and self._decode.backend is not None
        try:
            text = self._stream.step(self._decode.backend, token_id)
        except Exception:  # tokenizers' DecodeStreamError (e.g. a prefix that changed)
            self._stream = None
            return self._read_new_text(final=False)
        if text is not None:
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return text
        if len(self._ids) - self._read_offset < _MAX_PENDING_TOKENS:
            return ""
        self._stream = None
        return self._read_new_text(final=False)

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
