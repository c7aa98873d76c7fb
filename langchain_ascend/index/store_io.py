"""Conversions between a vector store's in-memory state and saved or foreign forms.

Pure helpers used by :class:`~langchain_ascend.vectorstores.AscendFAISS`: build the
:class:`~langchain_ascend.index.persistence.SavedIndex` of an index, rebuild an index from
one, pack a saved folder into bytes and back, and read an lc FAISS store for ``merge_from``.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from langchain_core.documents import Document

from langchain_ascend.errors import IndexFormatError, VectorStoreInputError
from langchain_ascend.index.persistence import SavedIndex

if TYPE_CHECKING:
    import torch


def snapshot(index: Any, documents: Sequence[Document], config: dict[str, Any]) -> SavedIndex:
    """Everything to save for ``index`` whose rows hold ``documents`` (in row order)."""
    import torch

    from langchain_ascend.index.faiss_io import FaissIndex, write_index_bytes
    from langchain_ascend.index.ivf import IVFIndex

    rows = [{"id": d.id, "page_content": d.page_content, "metadata": d.metadata}
            for d in documents]
    tensors: dict[str, torch.Tensor] = {}
    faiss_bytes = None
    if isinstance(index, FaissIndex):
        faiss_bytes = write_index_bytes(index.index)
        tensors["faiss_labels"] = torch.from_numpy(index.row_labels.copy())
    elif index is not None:
        tensors["vectors"] = index.vectors().contiguous()
        if isinstance(index, IVFIndex) and index.centroids is not None:
            assignments = index.assignments()
            assert assignments is not None
            tensors["centroids"] = index.centroids.clone()
            tensors["assignments"] = assignments.clone()
    return SavedIndex(config, rows, tensors, faiss_bytes)


def restore_index(saved: SavedIndex, new_index: Callable[[int], Any], *, metric: str,
                  device: Any, factory: str, count: int, dim: int, index_type: str) -> Any:
    """Rebuild the index of a save (``new_index(dim)`` makes an empty one of the right kind).

    Raises:
        IndexFormatError: Missing or mis-shaped parts.
    """
    from langchain_ascend.index.faiss_io import FaissIndex, import_faiss
    from langchain_ascend.index.ivf import IVFIndex

    if index_type == "faiss":
        if saved.faiss_bytes is None or "faiss_labels" not in saved.tensors:
            raise IndexFormatError("saved faiss index is missing index.faiss or its labels")
        faiss = import_faiss()
        try:
            raw = faiss.deserialize_index(np.frombuffer(saved.faiss_bytes, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexFormatError(f"index.faiss cannot be read: {exc}") from exc
        return FaissIndex(raw, metric, device=device,
                          row_labels=saved.tensors["faiss_labels"].cpu().numpy(), factory=factory)
    vectors = saved.tensors.get("vectors")
    if vectors is None or tuple(vectors.shape) != (count, dim):
        shape = None if vectors is None else tuple(vectors.shape)
        raise IndexFormatError(f"vectors have shape {shape}, expected {(count, dim)}")
    index = new_index(int(dim))
    index.add(vectors.to(device).float())
    if isinstance(index, IVFIndex) and "centroids" in saved.tensors:
        index.set_centroids(saved.tensors["centroids"], saved.tensors.get("assignments"))
    return index


def pack_tar(folder: Path) -> bytes:
    """An uncompressed tar of ``folder``'s contents, in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
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


def read_foreign_store(target: Any) -> tuple[list[str], list[Document], Any, Any]:
    """ids, documents, (N, D) vectors and distance strategy of an lc FAISS store.

    Raises:
        VectorStoreInputError: ``target`` is not an lc FAISS-like store or lacks documents.
    """
    import torch

    from langchain_ascend.index.faiss_io import flat_vectors

    index = getattr(target, "index", None)
    mapping = getattr(target, "index_to_docstore_id", None)
    docstore = getattr(target, "docstore", None)
    if index is None or mapping is None or docstore is None:
        raise VectorStoreInputError(
            f"cannot merge from {type(target).__name__}: expected an AscendFAISS or a "
            "langchain_community FAISS store")
    count = int(index.ntotal)
    ids = [str(mapping[i]) for i in range(count)]
    docs = []
    for doc_id in ids:
        doc = docstore.search(doc_id)
        if not isinstance(doc, Document):
            raise VectorStoreInputError(f"the other store has no document for id {doc_id!r}")
        docs.append(doc)
    raw = flat_vectors(index)
    if raw is None and count:
        raw = np.stack([index.reconstruct(i) for i in range(count)])
    vectors = None if raw is None else torch.from_numpy(raw)
    strategy = getattr(target, "distance_strategy", "EUCLIDEAN_DISTANCE")
    return ids, docs, vectors, strategy
