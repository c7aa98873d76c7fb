"""One save at a time per folder.

Within a process, one lock per resolved folder path (two spellings of a folder, or a symlink
to it, share it); across processes, an advisory ``fcntl.flock`` on :data:`LOCK_FILE` in the
folder, where ``fcntl`` exists (POSIX). The lock file is never deleted: deleting a flock file
lets two processes lock two different files of the same name.

A save holds the lock from writing its generation until its cleanup is done, so the cleanup
only ever sees the generations and staging folders of saves that finished or died.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

fcntl: Any
try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the in-process lock only
    fcntl = None

LOCK_FILE = ".ascend.lock"

_locks: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def _process_lock(folder: Path) -> Any:
    """The in-process lock of ``folder`` (kept while someone holds a reference to it)."""
    key = str(folder.resolve())
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = threading.Lock()
            _locks[key] = lock
        return lock


def _open_lock_file(folder: Path) -> int | None:
    """A descriptor of the lock file (created when missing); None when it cannot be opened
    (a read-only folder without one: nothing there can be saved or cleaned up anyway)."""
    path = folder / LOCK_FILE
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            return os.open(path, flags, 0o644)
        except OSError:
            continue
    return None


def _flock(fd: int, blocking: bool) -> bool:
    """Take the exclusive flock of ``fd``; False only when ``blocking`` is off and another
    holder has it (a filesystem without flock support counts as taken: it is advisory)."""
    if fcntl is None:  # pragma: no cover - Windows
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # e.g. ENOLCK on some network filesystems
        return True
    return True


@contextlib.contextmanager
def save_lock(folder: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold the save lock of an existing ``folder`` for the ``with`` block.

    Args:
        folder: The folder saved into.
        blocking: Wait for the lock; otherwise the block runs at once and gets False when
            another save (in this process or another) holds it.

    Yields:
        Whether the lock is held (always True when ``blocking``).
    """
    lock = _process_lock(folder)
    if not lock.acquire(blocking):
        yield False
        return
    try:
        fd = _open_lock_file(folder)
        try:
            yield fd is None or _flock(fd, blocking)
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock
    finally:
        lock.release()
