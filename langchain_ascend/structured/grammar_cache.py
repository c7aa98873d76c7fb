"""Compiled xgrammar grammars on disk, so a second process skips the compile.

A forced tool call's grammar over a 49k-token vocabulary takes ~0.6 s of CPU to compile and
~0.07 s to read back (SmolLM2, the demo's three tools, a loaded 2-core VM). Files live in
``<cache root>/grammars`` (``$LANGCHAIN_ASCEND_GRAMMAR_CACHE`` when set; see
:mod:`langchain_ascend.cache_dir`), one per grammar, named by a hash of everything the compiled
form depends on: this format's version, xgrammar's version, the tokenizer's fingerprint
(:func:`tokenizer_fingerprint`) and the spec's kind and text. A file that cannot be read back
(truncated, from another build) is removed and the grammar compiled again; a cache that cannot
be written is skipped. The newest :data:`MAX_FILES` files are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from langchain_ascend.cache_dir import GRAMMARS, cache_subdir
from langchain_ascend.structured.grammars import GrammarSpec

__all__ = ["CACHE_ENV_VAR", "MAX_FILES", "GrammarDiskCache", "tokenizer_fingerprint"]

CACHE_ENV_VAR = "LANGCHAIN_ASCEND_GRAMMAR_CACHE"
#: Bumped when what a file holds, or how a spec is compiled, changes.
FORMAT_VERSION = 1
MAX_FILES = 64
SUFFIX = ".grammar.json"


def tokenizer_fingerprint(decoded_vocab: Iterable[bytes], *, vocab_size: int,
                          stop_token_ids: Iterable[int], extra: Iterable[str] = ()) -> str:
    """A hash of what a compiled grammar depends on in the tokenizer: every token's bytes,
    the vocabulary size, the stop tokens and ``extra`` settings (vocab type, prefix space)."""
    digest = hashlib.sha256()
    for token in decoded_vocab:
        digest.update(len(token).to_bytes(4, "little"))
        digest.update(token)
    digest.update(f"|{int(vocab_size)}|{sorted(int(t) for t in stop_token_ids)}|".encode())
    digest.update("|".join(extra).encode())
    return digest.hexdigest()


def _xgrammar_version() -> str:
    try:
        return metadata.version("xgrammar")
    except metadata.PackageNotFoundError:
        return "unknown"


class GrammarDiskCache:
    """Compiled grammars of one tokenizer (by fingerprint) in ``folder``.

    Args:
        fingerprint: :func:`tokenizer_fingerprint` of the tokenizer the grammars are for.
        folder: Where the files go (default: the module docstring's folder).
    """

    def __init__(self, fingerprint: str, folder: Path | None = None) -> None:
        self.fingerprint = fingerprint
        self.folder = folder if folder is not None else cache_subdir(
            GRAMMARS, override_env=CACHE_ENV_VAR)
        self._version = _xgrammar_version()

    def path_for(self, spec: GrammarSpec) -> Path:
        """The file ``spec``'s compiled grammar is kept in."""
        kind, source = spec.cache_key
        key = "\0".join((str(FORMAT_VERSION), self._version, self.fingerprint, kind, source))
        return self.folder / (hashlib.sha256(key.encode()).hexdigest()[:32] + SUFFIX)

    def load(self, spec: GrammarSpec, read: Callable[[str], Any]) -> Any | None:
        """``read(text)`` of ``spec``'s file (xgrammar's ``deserialize_json``), or None when
        there is none or it cannot be read back (then it is removed)."""
        path = self.path_for(spec)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        try:
            return read(text)
        except Exception:  # noqa: BLE001 - any unreadable file means: compile again
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def store(self, spec: GrammarSpec, text: str) -> bool:
        """Write ``text`` (a compiled grammar's ``serialize_json()``) as ``spec``'s file,
        atomically; False when the folder cannot be written."""
        path = self.path_for(spec)
        temporary: str | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, path)
        except OSError:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        """Keep the newest :data:`MAX_FILES` grammar files."""
        with contextlib.suppress(OSError):
            files = sorted(self.folder.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime_ns)
            for old in files[:-MAX_FILES]:
                old.unlink()
