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
    """Hold an exclusive lock on ``lock_path`` (created if missing) for the block, across
    processes and threads, on every OS (``filelock``: ``fcntl`` on POSIX, ``msvcrt`` on
    Windows). Callers still publish with atomic renames, so readers never need the lock."""
    from filelock import FileLock

    # thread_local=False: one lock object, held by whichever thread entered it.
    with FileLock(str(lock_path), thread_local=False, is_singleton=False):
        yield


def make_shareable(folder: Path) -> None:
    """World-readable like any cache (``mkdtemp`` makes the folder private)."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
