"""The conversion cache: one folder per converted GGUF file, keyed by its content hash.

Layout (a folder's existence means "complete")::

    <cache>/gguf/<stem>-<sha256[:16]>-tf<transformers version>-v<CONVERTER_VERSION>/
        config.json  model.safetensors  generation_config.json
        tokenizer.json  tokenizer_config.json  chat_template.jinja ...
        source.json  (what it was converted from, and with which versions)
    <cache>/gguf/index.json  (path, size, mtime -> sha256: skips re-hashing an unchanged file)

A conversion writes into a temporary folder next to its final place and renames it into place
under a file lock (``filelock``), so two processes never convert the same file twice, and a
reader never sees half a folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from langchain_ascend.cache_dir import GGUF, cache_root
from langchain_ascend.engine.model_source.gguf_convert import convert_gguf
from langchain_ascend.engine.model_source.gguf_header import GGUFInfo
from langchain_ascend.engine.model_source.support import (
    file_lock,
    make_shareable,
    package_version,
    progress_bar,
)
from langchain_ascend.errors import ModelSourceError

GGUF_CACHE_SUBDIR = GGUF

# Bump when the conversion writes a different folder for the same file and library versions.
CONVERTER_VERSION = 1

_HASH_CHUNK = 8 << 20  # bytes read per step while hashing


def gguf_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder conversions are cached in: ``<root>/gguf``, the root being ``cache_dir``
    when given, else the package's cache root (:func:`langchain_ascend.cache_dir.cache_root`:
    ``$LANGCHAIN_ASCEND_CACHE``, ``$XDG_CACHE_HOME/langchain_ascend``,
    ``~/.cache/langchain_ascend``); not created."""
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else cache_root()
    return root / GGUF_CACHE_SUBDIR


def cache_key(sha256: str, gguf_name: str) -> str:
    """The cache folder name of a GGUF file: its stem, content hash, the transformers version
    and :data:`CONVERTER_VERSION` — a new transformers converts anew."""
    stem = re.sub(r"[^\w.-]", "_", Path(gguf_name).stem)[:80] or "model"
    return f"{stem}-{sha256[:16]}-tf{package_version('transformers')}-v{CONVERTER_VERSION}"


def file_sha256(path: Path, *, progress: bool = False) -> str:
    """The sha256 of a file's content, read in 8 MiB chunks (a tqdm bar when ``progress``)."""
    digest = hashlib.sha256()
    bar = progress_bar(progress, total=path.stat().st_size, unit="B", unit_scale=True,
                        desc=f"Hashing {path.name}")
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest()


def _stat_key(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def cached_sha256(path: Path, root: Path, *, progress: bool) -> str:
    """``path``'s sha256, taken from ``root/index.json`` when the file's (size, mtime, inode)
    are those recorded with it (a file rewritten in place changes its mtime), else hashed and
    recorded. A broken index is ignored and rewritten."""
    index_path = root / "index.json"
    real = str(path.resolve())
    stamp = _stat_key(path)
    entry = _read_index(index_path).get(real)
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()):
        sha = entry.get("sha256")
        if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
            return sha
    sha = file_sha256(path, progress=progress)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".index.lock"):
        files = _read_index(index_path)
        files[real] = {**stamp, "sha256": sha}
        fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".json", dir=root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": 1, "files": files}, handle, indent=1, sort_keys=True)
            os.replace(tmp, index_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return sha


def _read_index(index_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def _is_complete(folder: Path) -> bool:
    return (folder / "source.json").is_file() and (folder / "config.json").is_file()


def converted_folder(info: GGUFInfo, *, cache_root: Path, progress: bool) -> Path:
    """The cached HF folder of ``info.path``, converting (once, under a lock) when missing."""
    sha = cached_sha256(info.path, cache_root, progress=progress)
    final = cache_root / cache_key(sha, info.path.name)
    if _is_complete(final):
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_root / f".{final.name}.lock"):
        if _is_complete(final):  # another process finished it while we waited
            return final
        if final.exists():  # incomplete leftovers (files deleted by hand): set aside
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale.", dir=cache_root))
            os.replace(final, stale / "folder")
            shutil.rmtree(stale, ignore_errors=True)
        _check_memory(info)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache_root))
        try:
            convert_gguf(info.path, tmp, progress=progress)
            if not (tmp / "config.json").is_file():
                raise ModelSourceError(
                    f"converting {info.path} wrote no config.json into {tmp}; expected a "
                    "complete HF folder")
            manifest = {"source_file": str(info.path), "sha256": sha, "size": info.size,
                        "architecture": info.architecture, "name": info.name,
                        "transformers": package_version("transformers"),
                        "torch": package_version("torch"), "gguf": package_version("gguf"),
                        "converter_version": CONVERTER_VERSION}
            (tmp / "source.json").write_text(json.dumps(manifest, indent=2) + "\n",
                                             encoding="utf-8")
            make_shareable(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_complete(final):  # not a lost race: a real failure
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _check_memory(info: GGUFInfo) -> None:
    """Refuse a conversion that cannot fit: de-quantizing holds every weight in float32, and
    running out of memory kills the process instead of raising."""
    import psutil

    physical = int(psutil.virtual_memory().total)
    needed = 4 * info.num_elements
    if physical > 0 and needed > physical:
        raise ModelSourceError(
            f"de-quantizing {info.path} needs {needed / 2**30:.1f} GiB for its float32 weights "
            f"and this machine has {physical / 2**30:.1f} GiB of memory; expected a smaller "
            "model, or an HF folder in a smaller dtype")
