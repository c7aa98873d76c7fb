"""Compile grammar specs with xgrammar, once per tokenizer and spec, off the request's path.

Imports torch, numpy and xgrammar: load this module lazily (the chat model does, on the first
constrained request or in ``warm_up``).

:class:`GrammarBackend` (one per tokenizer + model vocabulary, shared process-wide through
:func:`get_grammar_backend`) owns what is built once per model: the xgrammar ``TokenizerInfo``,
one ``GrammarCompiler`` and the token masks the closing policy picks from. Each request gets its
own :class:`~.xgrammar_constraint.XGrammarConstraint`.

Why a new schema is cheap. An eager xgrammar compile builds the token mask of every position of
the grammar over the whole vocabulary up front (~0.35-0.45 s for one forced call over SmolLM2's
49k tokens, whatever the call will write). The compiler here is *dynamic*
(``enable_dynamic_compilation``): a compile only parses and optimises the grammar (~1-7 ms) and
each mask is built the first time a matcher reaches its position, so a call pays only for the
positions it visits (~3-9 ms over a whole call). The compiler's rule-level mask cache is shared by
every grammar of the tokenizer, so the parts tools have in common (the JSON string, number and
whitespace rules, the call syntax) are built once per process. Compiled grammars are cached by
content (:attr:`GrammarSpec.cache_key`, LRU): a repeated tool set reuses its grammar, masks
included, and compiles nothing.

Off the critical path. :meth:`GrammarBackend.new_constraint` checks the request's schemas at
once (so a bad one is an ``InvalidRequestError`` before the engine sees the request) and hands
the compile to the backend's compile thread; the constraint waits for it only when it first
needs the matcher, at the first sampled token (a forced call's opening text is appended before
that without the grammar: :attr:`GrammarSpec.forced_prefix`), so the compile overlaps the
prompt's prefill. A grammar without a forced prefix (JSON, a choice between tools) is waited
for when the scheduler asks for its forced text before the prefill, a few ms after the compile
started.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import xgrammar as xgr

from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured.grammars import GrammarSpec
from langchain_ascend.structured.packed_masks import pack_mask, unpack_mask
from langchain_ascend.structured.xgrammar_constraint import XGrammarConstraint

__all__ = ["GrammarBackend", "XGrammarConstraint", "get_grammar_backend", "pack_mask",
           "unpack_mask"]

_CLOSING_BYTES = (b'"', b"}", b"]")
_QUOTE_THEN_CLOSERS = re.compile(rb'^"[\]}\s]*$')
_QUOTE_COLON = re.compile(rb'^":\s?$')
_DIGITS = re.compile(rb"^\s?[0-9]+$")
_SEPARATORS = re.compile(rb"^[,:]\s?$")
_CLOSERS_ONLY = re.compile(rb"^\s*[\]}][\]}\s]*$")
_COMPILED_CACHE_SIZE = 256


def _embedded_schemas(node: Any) -> list[Any]:
    """The ``json_schema`` values of every ``{"type": "json_schema"}`` format in a structural
    tag (a tool's arguments)."""
    if isinstance(node, list):
        return [s for item in node for s in _embedded_schemas(item)]
    if not isinstance(node, dict):
        return []
    if node.get("type") == "json_schema" and "json_schema" in node:
        return [node["json_schema"]]
    return [s for value in node.values() for s in _embedded_schemas(value)]


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



_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\] \S+\.(?:cc|h|cpp):\d+: ")


def compiler_message(error: BaseException) -> str:
    """xgrammar's error without the C++ log prefix (``[20:32:23] /project/cpp/...cc:5082: ``):
    what is wrong with the schema, for the person who wrote it. Pure."""
    text = str(error).strip()
    return _SOURCE_PREFIX.sub("", text) or text

class GrammarBackend:
    """xgrammar state for one tokenizer and model vocabulary size.

    Args:
        tokenizer: The Hugging Face tokenizer.
        vocab_size: The model's vocabulary size (rows of ``lm_head``; may exceed the
            tokenizer's), i.e. the length of a logits row.
        stop_token_ids: Tokens that end a reply; the only tokens allowed once the grammar is
            complete, and never allowed before.

    Attributes:
        num_compiles: Grammars compiled so far (content-cache misses).
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: list[int]) -> None:
        if not stop_token_ids:
            raise InvalidRequestError("constrained decoding needs at least one stop token id")
        self.vocab_size = int(vocab_size)
        self.tokenizer = tokenizer
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids})
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=2, enable_dynamic_compilation=True)
        # cache_key -> the compile's future (done, or running on the compile thread)
        self._compiled: OrderedDict[tuple[str, str], Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._compile_thread = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="grammar-compile")
        self.num_compiles = 0
        self.special_tokens = special_tokens_of(tokenizer)
        decoded = list(self.tokenizer_info.decoded_vocab)[: self.vocab_size]
        decoded += [b""] * (self.vocab_size - len(decoded))
        self.decoded_vocab: list[bytes] = decoded
        self.token_lengths = np.array([len(t) for t in decoded], dtype=np.int64)  # (V,)
        self._special = self._special_mask(tokenizer)  # (V,) bool
        self.policy_masks = self._policy_masks()  # name -> (W,) int32

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

    def check(self, spec: GrammarSpec) -> None:
        """Refuse a spec xgrammar cannot build, at once (~1 ms): the JSON schemas a request
        brings (a ``json_schema`` spec's own, each tool's arguments in a structural tag) are
        converted to grammars here; the structural tag around them is this package's own.

        Raises:
            InvalidRequestError: A schema xgrammar rejects, or an unknown kind.
        """
        if spec.kind == "json_object":
            return
        if spec.kind == "json_schema":
            schemas = [spec.source]
        elif spec.kind == "structural_tag":
            schemas = [json.dumps(s) for s in _embedded_schemas(json.loads(spec.source))]
        else:
            raise InvalidRequestError(f"unknown grammar kind {spec.kind!r}")
        for schema in schemas:
            try:
                xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
            except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses
                raise InvalidRequestError(
                    f"cannot build a grammar for this schema: {compiler_message(exc)}") from exc

    def compile_async(self, spec: GrammarSpec) -> Future[Any]:
        """The compiled grammar of ``spec`` as a future: the cached one when this content was
        compiled (or is being compiled) before, else a compile started on the compile thread.

        Raises:
            InvalidRequestError: xgrammar rejects the schema (raised here, by :meth:`check`,
                not through the future).
        """
        key = spec.cache_key
        with self._lock:
            pending = self._compiled.get(key)
            if pending is not None:
                self._compiled.move_to_end(key)
                return pending
        self.check(spec)
        with self._lock:
            pending = self._compiled.get(key)  # another thread got here first
            if pending is None:
                pending = self._compile_thread.submit(self._compile_now, spec)
                self.num_compiles += 1
                self._compiled[key] = pending
                while len(self._compiled) > _COMPILED_CACHE_SIZE:
                    self._compiled.popitem(last=False)
        pending.add_done_callback(lambda done: self._forget_failed(key, done))
        return pending

    def _compile_now(self, spec: GrammarSpec) -> Any:
        """Compile ``spec`` (dynamic: no token mask is built yet)."""
        try:
            if spec.kind == "json_schema":
                return self._compiler.compile_json_schema(
                    spec.source, any_whitespace=False, strict_mode=True)
            if spec.kind == "json_object":
                return self._compiler.compile_json_schema(
                    json.dumps({"type": "object"}), any_whitespace=False, strict_mode=False)
            return self._compiler.compile_structural_tag(spec.source)
        except Exception as exc:  # noqa: BLE001 - surfaces where the grammar is awaited
            raise InvalidRequestError(
                f"cannot build a grammar for this schema: {compiler_message(exc)}") from exc

    def _forget_failed(self, key: tuple[str, str], done: Future[Any]) -> None:
        """A compile that failed is not kept: the next request with that content retries."""
        if done.exception() is not None:
            with self._lock:
                if self._compiled.get(key) is done:
                    del self._compiled[key]

    def compile(self, spec: GrammarSpec) -> Any:
        """Compile ``spec`` and wait for it (cached by content; see :meth:`compile_async`).

        Raises:
            InvalidRequestError: xgrammar rejects the schema / structural tag.
        """
        return self.compile_async(spec).result()

    def is_cached(self, spec: GrammarSpec) -> bool:
        """Whether ``spec``'s content is compiled (or being compiled) and cached."""
        with self._lock:
            return spec.cache_key in self._compiled

    def num_cached(self) -> int:
        """Compiled grammars held in the cache."""
        with self._lock:
            return len(self._compiled)

    def new_constraint(self, spec: GrammarSpec, *, max_tokens: int,
                       report_shortened: bool = True) -> XGrammarConstraint:
        """A fresh per-request constraint for ``spec`` with a budget of ``max_tokens``; its
        grammar may still be compiling (the constraint waits for it at its first mask).
        ``report_shortened``: whether a reply the budget guard shortened says so
        (``XGrammarConstraint.shortened``).

        Raises:
            InvalidRequestError: xgrammar rejects the schema / structural tag.
        """
        compiled = self.compile_async(spec)
        banned = self._special.copy()  # (V,)
        for token in spec.required_special_tokens:
            if token in self.special_tokens:
                banned[self.special_tokens[token]] = False
        return XGrammarConstraint(
            compiled, backend=self, base_mask=pack_mask(~banned), max_tokens=max_tokens,
            forced_prefix=spec.forced_prefix, report_shortened=report_shortened,
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
