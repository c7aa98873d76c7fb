"""faiss files, and the folders and bytes ``langchain_community`` FAISS writes (they hold a
pickle: read only when the caller opted in with ``allow_dangerous_deserialization=True``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from langchain_ascend.errors import IndexFormatError, UnsafeDeserializationError
from langchain_ascend.index.distance import DistanceStrategy
from langchain_ascend.index.faiss_io import import_faiss, metric_of

DANGEROUS_MESSAGE = (
    "this folder was written by langchain_community FAISS and loading it unpickles "
    "{path}; pickle files can run arbitrary code. Pass allow_dangerous_deserialization=True "
    "only for a folder you created or trust (then re-save it with save_local to get a "
    "pickle-free copy)."
)


def write_index_bytes(index: Any) -> bytes:
    """Serialise a faiss index to bytes (the ``.faiss`` file format)."""
    faiss = import_faiss()
    return faiss.serialize_index(index).tobytes()


def read_index_file(path: Path) -> Any:
    """Read a ``.faiss`` file.

    Raises:
        IndexFormatError: Missing, truncated or not a faiss index.
    """
    faiss = import_faiss()
    if not path.is_file():
        raise IndexFormatError(f"faiss index file {path} is missing")
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        raise IndexFormatError(f"{path} is not a readable faiss index (truncated or corrupted): "
                               f"{str(exc).strip().splitlines()[-1]}") from exc


def read_langchain_folder(folder: Path, index_name: str) -> tuple[Any, Any, dict[int, str]]:
    """Read a folder written by ``langchain_community`` FAISS ``save_local``.

    Unpickles ``{index_name}.pkl``: call only after the caller opted in with
    ``allow_dangerous_deserialization=True``.

    Returns:
        ``(faiss index, docstore, index_to_docstore_id)``.

    Raises:
        IndexFormatError: A file is missing or unreadable.
    """
    index = read_index_file(folder / f"{index_name}.faiss")
    pkl = folder / f"{index_name}.pkl"
    if not pkl.is_file():
        raise IndexFormatError(f"{pkl} is missing")
    try:
        with open(pkl, "rb") as fh:
            docstore, index_to_docstore_id = pickle.load(fh)  # noqa: S301 - explicit opt-in
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a format problem
        raise IndexFormatError(f"{pkl} cannot be read: {type(exc).__name__}: {exc}") from exc
    return index, docstore, dict(index_to_docstore_id)


def read_lc_folder(folder: Path, index_name: str, allow_dangerous_deserialization: bool,
                   kwargs: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """The faiss index, docstore and mapping of an lc FAISS folder (None when there is none);
    ``kwargs`` gets the folder's distance strategy unless it names one.

    Raises:
        UnsafeDeserializationError: An lc folder without the flag.
    """
    pkl = folder / f"{index_name}.pkl"
    if not (pkl.exists() or (folder / f"{index_name}.faiss").exists()):
        return None
    if not allow_dangerous_deserialization:
        raise UnsafeDeserializationError(DANGEROUS_MESSAGE.format(path=pkl))
    index, docstore, mapping = read_langchain_folder(folder, index_name)
    _default_strategy(index, kwargs)
    return index, docstore, mapping


def read_lc_pickle(serialized: bytes, allow_dangerous_deserialization: bool,
                   kwargs: dict[str, Any]) -> Any:
    """``(index, docstore, mapping)`` of lc FAISS's ``serialize_to_bytes`` (a pickle);
    ``kwargs`` gets the index's distance strategy unless it names one.

    Raises:
        UnsafeDeserializationError: Without the flag.
        IndexFormatError: The pickle is not lc FAISS's triple.
    """
    if not allow_dangerous_deserialization:
        raise UnsafeDeserializationError(DANGEROUS_MESSAGE.format(path="the given bytes"))
    try:
        index, docstore, mapping = pickle.loads(serialized)  # noqa: S301 - explicit opt-in
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a format problem
        raise IndexFormatError(f"the given bytes are not langchain_community FAISS's "
                               f"serialize_to_bytes: {type(exc).__name__}: {exc}") from exc
    _default_strategy(index, kwargs)
    return index, docstore, mapping


def _default_strategy(index: Any, kwargs: dict[str, Any]) -> None:
    """The strategy of an lc store's faiss index (its metric) into ``kwargs``, unless named."""
    if "distance_strategy" not in kwargs:
        kwargs["distance_strategy"] = (DistanceStrategy.MAX_INNER_PRODUCT
                                       if metric_of(index) == "ip"
                                       else DistanceStrategy.EUCLIDEAN_DISTANCE)
