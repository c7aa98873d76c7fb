"""Compile grammar specs with xgrammar, once per tokenizer and spec.

Imports torch, numpy and xgrammar: load this module lazily (the chat model does, on the first
constrained request or in ``warm_up``).

:class:`GrammarBackend` (one per tokenizer + model vocabulary, shared process-wide through
:func:`get_grammar_backend`) owns the xgrammar ``TokenizerInfo`` and ``GrammarCompiler``, a
cache of compiled grammars keyed by spec, and the token masks the closing policy picks from;
each request gets its own :class:`~.xgrammar_constraint.XGrammarConstraint`. Compiled grammars
are also kept on disk (:mod:`~.grammar_cache`) for the next process.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import xgrammar as xgr

from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured.grammar_cache import GrammarDiskCache, tokenizer_fingerprint
from langchain_ascend.structured.grammars import GrammarSpec
from langchain_ascend.structured.xgrammar_constraint import (
    XGrammarConstraint,
    pack_mask,
    unpack_mask,
)

__all__ = ["GrammarBackend", "XGrammarConstraint", "get_grammar_backend", "pack_mask",
           "unpack_mask"]

_CLOSING_BYTES = (b'"', b"}", b"]")
_QUOTE_THEN_CLOSERS = re.compile(rb'^"[\]}\s]*$')
_QUOTE_COLON = re.compile(rb'^":\s?$')
_DIGITS = re.compile(rb"^\s?[0-9]+$")
_SEPARATORS = re.compile(rb"^[,:]\s?$")
_CLOSERS_ONLY = re.compile(rb"^\s*[\]}][\]}\s]*$")
_COMPILED_CACHE_SIZE = 256


def _whole_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _growth_flags(decoded: list[bytes], tiers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per token: whether it can lengthen the closing path by at most 0, 3 or 5 tokens (see
    ``GrammarBackend._policy_masks``), from the policy's own ``quote_then_closers``,
    ``digits`` and ``closers`` flags."""
    no_quote = np.array([b'"' not in t for t in decoded], dtype=bool)
    plain = no_quote & np.array([b"\\" not in t for t in decoded], dtype=bool)
    whole = np.array([bool(t) and _whole_utf8(t) for t in decoded], dtype=bool)
    closing_quote = tiers["quote_then_closers"]
    spaces = np.array([t.isspace() for t in decoded], dtype=bool)
    return {"grows_0_in_string": (plain & whole) | closing_quote,
            "grows_3_in_string": plain | closing_quote,
            "grows_5_in_string": no_quote | closing_quote,
            "grows_0_outside": spaces | tiers["digits"] | tiers["closers"]}


class GrammarBackend:
    """xgrammar state for one tokenizer and model vocabulary size.

    Args:
        tokenizer: The Hugging Face tokenizer.
        vocab_size: The model's vocabulary size (rows of ``lm_head``; may exceed the
            tokenizer's), i.e. the length of a logits row.
        stop_token_ids: Tokens that end a reply; the only tokens allowed once the grammar is
            complete, and never allowed before.
        disk_cache: Where compiled grammars are kept between processes: ``True`` the default
            folder (:mod:`~.grammar_cache`), a :class:`GrammarDiskCache`, or ``False``: none.
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: list[int],
                 disk_cache: GrammarDiskCache | None | bool = True) -> None:
        if not stop_token_ids:
            raise InvalidRequestError("constrained decoding needs at least one stop token id")
        self.vocab_size = int(vocab_size)
        self.tokenizer = tokenizer
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids})
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=2)
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.special_tokens = special_tokens_of(tokenizer)
        decoded = list(self.tokenizer_info.decoded_vocab)[: self.vocab_size]
        decoded += [b""] * (self.vocab_size - len(decoded))
        self.decoded_vocab: list[bytes] = decoded
        self.token_lengths = np.array([len(t) for t in decoded], dtype=np.int64)  # (V,)
        self.disk_cache = self._disk_cache(disk_cache)
        self._special = self._special_mask(tokenizer)  # (V,) bool
        self.policy_masks = self._policy_masks()  # name -> (W,) int32

    def _disk_cache(self, choice: GrammarDiskCache | None | bool) -> GrammarDiskCache | None:
        """``True``: the default folder, for this tokenizer; ``False``/``None``: none."""
        if choice is True:
            info = self.tokenizer_info
            return GrammarDiskCache(tokenizer_fingerprint(
                self.decoded_vocab, vocab_size=self.vocab_size,
                stop_token_ids=self.stop_token_ids,
                extra=(str(info.vocab_type), str(info.add_prefix_space),
                       str(sorted(info.special_token_ids)))))
        return choice or None

    def _special_mask(self, tokenizer: Any) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)  # (V,)
        mask[[i for i in self.special_tokens.values() if 0 <= i < self.vocab_size]] = True
        # Rows past the tokenizer's vocabulary (lm_head padding) are never real tokens.
        mask[len(tokenizer) :] = True
        mask[self.stop_token_ids] = False
        return mask

    def _policy_masks(self) -> dict[str, np.ndarray]:
        """Packed masks the closing policy picks from (every one includes the stop tokens).

        ``quote_colon``: ``":`` (ends a key and writes the colon that must follow);
        ``quote_then_closers``: ``"`` then only ``]``/``}``/whitespace; ``quote_first``: starts
        with ``"`` and opens nothing; ``closers``: only ``]``/``}``/whitespace;
        ``contains_no_opener``: has ``"``, ``]`` or ``}`` and no ``{``/``[``; ``separators``:
        ``,`` or ``:`` (ends a number, moves to the next required part); ``digits``: an
        optional space then digits (a whole number); ``no_opener``: no ``{``/``[``; ``stop``:
        the stop tokens.

        The budget guard's growth bounds: ``grows_0_in_string`` (whole UTF-8 text without
        ``"`` or ``\\``, or a quote then closers: never lengthens the closing path inside a
        string), ``grows_3_in_string`` (no ``"`` or ``\\``: at most 3 continuation bytes
        pending), ``grows_5_in_string`` (no ``"``: at most an escape's ``uXXXX`` pending),
        ``grows_0_outside`` (whitespace, digits or closers only).
        """
        decoded = self.decoded_vocab
        no_opener = np.array([b"{" not in t and b"[" not in t for t in decoded], dtype=bool)
        flags = {
            "quote_colon": np.array([bool(_QUOTE_COLON.match(t)) for t in decoded]),
            "quote_then_closers": np.array([bool(_QUOTE_THEN_CLOSERS.match(t)) for t in decoded]),
            "quote_first": np.array([t.startswith(b'"') for t in decoded]) & no_opener,
            "closers": np.array([bool(_CLOSERS_ONLY.match(t)) for t in decoded]),
            "contains_no_opener": np.array(
                [any(b in t for b in _CLOSING_BYTES) for t in decoded]
            ) & no_opener,
            "separators": np.array([bool(_SEPARATORS.match(t)) for t in decoded]),
            "digits": np.array([bool(_DIGITS.match(t)) for t in decoded]),
            "no_opener": no_opener,
            "stop": np.zeros(self.vocab_size, dtype=bool),
        }
        flags.update(_growth_flags(decoded, flags))
        packed = {}
        for name, mask in flags.items():
            mask = mask.astype(bool)
            mask[self.stop_token_ids] = True
            packed[name] = pack_mask(mask)
        return packed

    def compile(self, spec: GrammarSpec) -> Any:
        """Compile ``spec`` (cached by spec in memory, and on disk: ``grammar_cache``).

        Raises:
            InvalidRequestError: xgrammar rejects the schema / structural tag.
        """
        with self._lock:
            compiled = self._compiled.get(spec.cache_key)
            if compiled is not None:
                self._compiled.move_to_end(spec.cache_key)
                return compiled
        compiled = self._read_stored(spec)
        if compiled is None:
            compiled = self._compile_now(spec)
            if self.disk_cache is not None:
                self.disk_cache.store(spec, compiled.serialize_json())
        with self._lock:
            self._compiled[spec.cache_key] = compiled
            while len(self._compiled) > _COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled

    def _read_stored(self, spec: GrammarSpec) -> Any | None:
        if self.disk_cache is None:
            return None
        return self.disk_cache.load(
            spec, lambda text: xgr.CompiledGrammar.deserialize_json(text, self.tokenizer_info))

    def _compile_now(self, spec: GrammarSpec) -> Any:
        try:
            if spec.kind == "json_schema":
                compiled = self._compiler.compile_json_schema(
                    spec.source, any_whitespace=False, strict_mode=True
                )
            elif spec.kind == "json_object":
                compiled = self._compiler.compile_json_schema(
                    json.dumps({"type": "object"}), any_whitespace=False, strict_mode=False
                )
            elif spec.kind == "structural_tag":
                compiled = self._compiler.compile_structural_tag(spec.source)
            else:
                raise InvalidRequestError(f"unknown grammar kind {spec.kind!r}")
        except InvalidRequestError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses
            raise InvalidRequestError(f"cannot build a grammar for this schema: {exc}") from exc
        return compiled

    def is_cached(self, spec: GrammarSpec) -> bool:
        """Whether ``spec`` is compiled and cached."""
        with self._lock:
            return spec.cache_key in self._compiled

    def num_cached(self) -> int:
        """Compiled grammars held in the cache."""
        with self._lock:
            return len(self._compiled)

    def new_constraint(self, spec: GrammarSpec, *, max_tokens: int) -> XGrammarConstraint:
        """A fresh per-request constraint for ``spec`` with a budget of ``max_tokens``."""
        compiled = self.compile(spec)
        banned = self._special.copy()  # (V,)
        for token in spec.required_special_tokens:
            if token in self.special_tokens:
                banned[self.special_tokens[token]] = False
        return XGrammarConstraint(
            compiled, backend=self, base_mask=pack_mask(~banned), max_tokens=max_tokens
        )


_BACKENDS: dict[tuple[int, int, tuple[int, ...]], tuple[Any, GrammarBackend]] = {}
_BACKENDS_LOCK = threading.Lock()


def get_grammar_backend(
    tokenizer: Any, *, vocab_size: int, stop_token_ids: list[int]
) -> GrammarBackend:
    """The process-wide :class:`GrammarBackend` for this tokenizer object and vocabulary."""
    key = (id(tokenizer), int(vocab_size), tuple(sorted(set(stop_token_ids))))
    with _BACKENDS_LOCK:
        entry = _BACKENDS.get(key)
        if entry is not None and entry[0] is tokenizer:
            return entry[1]
        backend = GrammarBackend(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        _BACKENDS[key] = (tokenizer, backend)
        return backend
