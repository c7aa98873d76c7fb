"""Small helpers the GGUF cache and the conversion share (and the test-model cache reuses):
library versions, progress bars, an advisory file lock, cache-folder permissions."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"absent"``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar built with ``kwargs`` when ``enabled``, else ``None``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``lock_path`` (created if missing) for the block.

    Where ``fcntl`` is missing (not POSIX) it does nothing: callers publish with atomic renames,
    which alone keep readers safe.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def make_shareable(folder: Path) -> None:
    """World-readable like any cache (``mkdtemp`` makes the folder private)."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
