"""Reading and writing vector stores: the one door :class:`~langchain_ascend.AscendFAISS` uses.

* our pickle-free folder format (:mod:`.folder`: safetensors + JSON, checksummed, written
  atomically), filled from and read back into a store's state by :mod:`.snapshot`;
* folders and bytes written by ``langchain_community`` FAISS (:mod:`.faiss_files`; they hold a
  pickle, read only with ``allow_dangerous_deserialization=True``);
* ``serialize_to_bytes``: a folder of ours as an uncompressed tar, in memory.

A load gives a :class:`LoadedStore`: the constructor arguments of the new store and the rows
to fill into it, so the store builds itself the same way whatever it was read from.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_ascend.errors import IndexFormatError
from langchain_ascend.index.persist.faiss_files import read_lc_folder, read_lc_pickle
from langchain_ascend.index.persist.folder import (
    SavedIndex,
    has_saved_index,
    load_folder,
    save_folder,
)
from langchain_ascend.index.persist.folder_lock import LOCK_FILE
from langchain_ascend.index.persist.snapshot import options_from_config, restore_state, snapshot
from langchain_ascend.index.store_state import IndexOptions, StoreState

_PICKLE_START = b"\x80"  # lc FAISS's serialize_to_bytes is a pickle; ours is a tar


@dataclass
class LoadedStore:
    """A store as read: build it with ``cls(embeddings, *args, **options)``, then :meth:`fill`.

    Attributes:
        args: ``(index, docstore, index_to_docstore_id)`` of an lc FAISS store (adopted by
            the constructor); empty for a save of ours.
        options: Constructor keyword options (the caller's win over the saved ones).
        saved: A save of ours, whose rows :meth:`fill` restores.
    """

    args: tuple[Any, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    saved: SavedIndex | None = None
    count: int = 0
    dim: Any = None

    def fill(self, state: StoreState, options: IndexOptions) -> None:
        """Put the saved rows into the new store's empty ``state``.

        Raises:
            IndexFormatError: Counts, shapes or ids that do not add up.
        """
        if self.saved is not None:
            restore_state(self.saved, state, options, factory=self.options["faiss_factory"],
                          count=self.count, dim=self.dim)


def save(folder: str | Path, index_name: str, state: StoreState, options: IndexOptions, *,
         distance_strategy: str, normalize_L2: bool) -> None:  # noqa: N803
    """Write the store of ``state`` under ``folder`` atomically (see :mod:`.folder`).

    Raises:
        VectorStoreInputError: A metadata value cannot be stored (nothing is written).
    """
    with state.lock:
        saved = snapshot(state.index, state.documents(), options.saved_config(
            state.index, distance_strategy=distance_strategy, normalize_L2=normalize_L2,
            num_vectors=len(state.row_ids)))
    save_folder(Path(folder), index_name, saved)


def load(folder: str | Path, index_name: str, *, allow_dangerous_deserialization: bool,
         options: dict[str, Any]) -> LoadedStore:
    """Read a save of ours, or an lc FAISS folder (its distance strategy taken from the faiss
    index's metric unless ``options`` names one).

    Raises:
        IndexFormatError: Nothing saved under that name, or damaged files.
        ChecksumMismatchError: A file changed since it was saved.
        UnsafeDeserializationError: An lc folder without the flag.
    """
    folder = Path(folder)
    if has_saved_index(folder, index_name):
        saved = load_folder(folder, index_name)
        saved_options, count, dim = options_from_config(saved.config, options)
        return LoadedStore((), saved_options, saved, count, dim)
    lc_parts = read_lc_folder(folder, index_name, allow_dangerous_deserialization, options)
    if lc_parts is not None:
        return LoadedStore(lc_parts, options)
    raise IndexFormatError(f"no saved index named {index_name!r} in {folder}")


def to_bytes(save_into: Callable[[Path], None]) -> bytes:
    """What ``save_into(folder)`` writes, as an uncompressed tar in memory (no pickle)."""
    with tempfile.TemporaryDirectory() as tmp:
        save_into(Path(tmp))
        return pack_tar(Path(tmp))


def load_bytes(data: bytes, *, allow_dangerous_deserialization: bool,
               options: dict[str, Any]) -> LoadedStore:
    """Read :func:`to_bytes` output, or lc FAISS's ``serialize_to_bytes`` pickle.

    Raises:
        UnsafeDeserializationError: An lc pickle without the flag.
        IndexFormatError: The bytes are neither format.
    """
    if not data.startswith(_PICKLE_START):
        with tempfile.TemporaryDirectory() as tmp:
            extract_tar(data, Path(tmp))
            return load(tmp, "index", allow_dangerous_deserialization=False, options=options)
    options = dict(options)
    index, docstore, mapping = read_lc_pickle(data, allow_dangerous_deserialization, options)
    return LoadedStore((index, docstore, mapping), options)


def pack_tar(folder: Path) -> bytes:
    """An uncompressed tar of ``folder``'s contents, in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.name != LOCK_FILE:  # only a save's files travel
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def extract_tar(data: bytes, into: Path) -> None:
    """Unpack a :func:`pack_tar` archive (plain files and folders only, nothing outside)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if Path(member.name).is_absolute() or ".." in parts or not (
                        member.isfile() or member.isdir()):
                    raise IndexFormatError(f"unsafe entry {member.name!r} in serialized store")
                target = into.joinpath(*parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
    except tarfile.TarError as exc:
        raise IndexFormatError(f"not a serialized AscendFAISS store: {exc}") from exc


__all__ = ["LoadedStore", "load", "load_bytes", "save", "to_bytes"]
