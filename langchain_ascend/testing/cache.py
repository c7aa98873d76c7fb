"""Cache folder, build fingerprints and race-safe atomic builds for the test artefacts.

A build writes into a fresh temporary folder next to its final place and then renames it
into place, so a reader never sees a half-written folder. A file lock per artefact
(``filelock``) keeps two processes from doing the same work twice; the rename alone would
still be safe: the loser discards its copy and uses the winner's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata, resources
from pathlib import Path

from langchain_ascend.cache_dir import CACHE_ENV_VAR, MODELS, cache_subdir
from langchain_ascend.engine.model_source.support import file_lock, make_shareable

__all__ = ["CACHE_ENV_VAR", "build_once", "builder_fingerprint", "resolve_cache_dir"]

# Bump when the on-disk layout changes in a way the source fingerprint would not notice.
BUILDER_VERSION = 1

# Package files that decide what a tokenizer build writes; a model build adds its own module.
TOKENIZER_SOURCES = (
    "cache.py",
    "corpus.py",
    "tokenizer_builder.py",
    "data/prose_en.txt",
    "data/chat_template.jinja",
)
_FINGERPRINTED_DISTRIBUTIONS = ("transformers", "tokenizers", "torch", "safetensors")


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the test-model cache folder: the argument, else ``models/`` of the package's
    cache root (``$LANGCHAIN_ASCEND_CACHE``, ``$XDG_CACHE_HOME/langchain_ascend`` or
    ``~/.cache/langchain_ascend``: :func:`langchain_ascend.cache_dir.cache_root`).

    Args:
        cache_dir: Explicit folder; ``None`` falls back to ``<cache root>/models``.

    Returns:
        The absolute cache folder (created if missing).
    """
    path = Path(cache_dir).expanduser().resolve() if cache_dir is not None else cache_subdir(MODELS)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def builder_fingerprint(sources: tuple[str, ...], *parts: object) -> str:
    """Hash builder sources, library versions and ``parts`` into a short hex digest.

    Args:
        sources: Files of this package (relative paths) whose content decides the build.
        *parts: Build parameters (their ``repr`` is hashed).

    Any change to the builder code, its bundled data, the libraries that write the files or
    the build parameters yields a different digest, hence a different cache folder.
    """
    digest = hashlib.sha256(f"builder-v{BUILDER_VERSION}".encode())
    package = resources.files("langchain_ascend.testing")
    for relative in sources:
        digest.update(relative.encode())
        digest.update(package.joinpath(relative).read_bytes())
    for name in _FINGERPRINTED_DISTRIBUTIONS:
        digest.update(f"{name}={_distribution_version(name)}".encode())
    for part in parts:
        digest.update(repr(part).encode())
    return digest.hexdigest()[:12]


def build_once(final_dir: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final_dir``, calling ``build(tmp_dir)`` and renaming it into place if missing.

    Args:
        final_dir: Where the finished artefact lives; its existence means "complete".
        build: Writes the artefact's files into the (empty, existing) folder it is given.

    Returns:
        ``final_dir``.
    """
    if final_dir.is_dir():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final_dir.parent / f".{final_dir.name}.lock"):
        if final_dir.is_dir():
            return final_dir
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.", dir=final_dir.parent))
        try:
            build(tmp_dir)
            make_shareable(tmp_dir)
            try:
                os.rename(tmp_dir, final_dir)
            except OSError:
                if not final_dir.is_dir():
                    raise
        finally:
            if tmp_dir.exists():
                shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir
