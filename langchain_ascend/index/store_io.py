"""Conversions between a vector store's in-memory state and saved or foreign forms.

Helpers of :class:`~langchain_ascend.vectorstores.AscendFAISS`: build the
:class:`~langchain_ascend.index.persistence.SavedIndex` of an index and read one back (its
options, its index, its rows), pack a saved folder into bytes and back, adopt the index and
docstore an lc FAISS is built from, and read an lc FAISS store for ``merge_from``.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from langchain_core.documents import Document

from langchain_ascend.errors import (
    EmbeddingDimensionError,
    IndexFormatError,
    UnsafeDeserializationError,
    VectorStoreInputError,
)
from langchain_ascend.index.distance import DistanceStrategy, as_strategy
from langchain_ascend.index.persistence import SavedIndex
from langchain_ascend.index.store_state import IndexOptions, StoreState

if TYPE_CHECKING:
    import torch

    from langchain_ascend.index.device_index import FlatIndex
    from langchain_ascend.index.faiss_io import FaissIndex

DANGEROUS_MESSAGE = (
    "this folder was written by langchain_community FAISS and loading it unpickles "
    "{path}; pickle files can run arbitrary code. Pass allow_dangerous_deserialization=True "
    "only for a folder you created or trust (then re-save it with save_local to get a "
    "pickle-free copy)."
)


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


def options_from_config(config: dict[str, Any],
                        kwargs: dict[str, Any]) -> tuple[dict[str, Any], int, Any]:
    """Constructor options of a saved store (``kwargs`` win), its vector count and dim.

    Raises:
        IndexFormatError: The config lacks a field.
        VectorStoreInputError: ``kwargs`` asks for another distance strategy.
    """
    try:
        strategy = as_strategy(config["distance_strategy"])
        options = {
            "normalize_L2": bool(config["normalize_L2"]),
            "distance_strategy": strategy,
            "index_type": config["index_type"],
            "dtype": config.get("dtype", "float32"),
            "nlist": config.get("nlist"),
            "nprobe": config.get("nprobe"),
            "faiss_factory": config.get("faiss_factory") or "Flat",
            "ivf_min_train_size": config.get("ivf_min_train_size"),
        }
        dim, count = config["dim"], int(config["num_vectors"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(f"saved index config is incomplete: {exc}") from exc
    if "distance_strategy" in kwargs and as_strategy(kwargs["distance_strategy"]) != strategy:
        raise VectorStoreInputError(
            f"the saved index uses {strategy.value}; it cannot be loaded as "
            f"{as_strategy(kwargs['distance_strategy']).value}")
    options.update(kwargs)
    return options, count, dim


def restore_state(saved: SavedIndex, state: StoreState, options: IndexOptions, *,
                  factory: str, count: int, dim: int) -> None:
    """Fill an empty ``state`` with the rows of a save holding ``count`` vectors.

    Raises:
        IndexFormatError: Counts, shapes or ids that do not add up.
    """
    if len(saved.documents) != count:
        raise IndexFormatError(
            f"docstore.json holds {len(saved.documents)} documents, expected {count}")
    if count == 0:
        return
    index = restore_index(saved, options.new_index, metric=options.metric,
                          device=options.device, factory=factory, count=count, dim=dim,
                          index_type=options.index_type)
    if index.ntotal != count:
        raise IndexFormatError(f"index holds {index.ntotal} vectors, expected {count}")
    ids = [row["id"] for row in saved.documents]
    if len(set(ids)) != len(ids):
        raise IndexFormatError("docstore.json repeats a document id")
    state.install(index, ids, {row["id"]: Document(
        id=row["id"], page_content=row["page_content"], metadata=row["metadata"])
        for row in saved.documents})


def read_lc_folder(folder: Path, index_name: str, allow_dangerous_deserialization: bool,
                   kwargs: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """The faiss index, docstore and mapping of an lc FAISS folder (None when there is none);
    ``kwargs`` gets the folder's distance strategy unless it names one.

    Raises:
        UnsafeDeserializationError: An lc folder without the flag.
    """
    from langchain_ascend.index.faiss_io import metric_of, read_langchain_folder

    pkl = folder / f"{index_name}.pkl"
    if not (pkl.exists() or (folder / f"{index_name}.faiss").exists()):
        return None
    if not allow_dangerous_deserialization:
        raise UnsafeDeserializationError(DANGEROUS_MESSAGE.format(path=pkl))
    index, docstore, mapping = read_langchain_folder(folder, index_name)
    if "distance_strategy" not in kwargs:
        kwargs["distance_strategy"] = (DistanceStrategy.MAX_INNER_PRODUCT
                                       if metric_of(index) == "ip"
                                       else DistanceStrategy.EUCLIDEAN_DISTANCE)
    return index, docstore, mapping


def read_lc_pickle(serialized: bytes, allow_dangerous_deserialization: bool) -> Any:
    """``(index, docstore, mapping)`` of lc FAISS's ``serialize_to_bytes`` (a pickle).

    Raises:
        UnsafeDeserializationError: Without the flag.
    """
    if not allow_dangerous_deserialization:
        raise UnsafeDeserializationError(DANGEROUS_MESSAGE.format(path="the given bytes"))
    import pickle

    return pickle.loads(serialized)  # noqa: S301 - explicit opt-in


def adopt(state: StoreState, options: IndexOptions, strategy: DistanceStrategy, index: Any,
          docstore: Any, mapping: Any) -> None:
    """Take over a populated index plus its documents (lc FAISS construction).

    A flat faiss index is copied to the device unless the store is a faiss store; any other
    faiss index stays one (``options.index_type`` becomes ``"faiss"``).

    Raises:
        VectorStoreInputError: Missing docstore or mapping, ids missing or repeated, or a
            faiss index of another metric.
    """
    from langchain_ascend.index.device_index import FlatIndex
    from langchain_ascend.index.faiss_io import FaissIndex

    if isinstance(index, (FlatIndex, FaissIndex)):
        backend = index
        labels = list(range(backend.ntotal))
    else:
        backend, labels = _from_faiss_object(options, strategy, index)
    count = backend.ntotal
    if count and (docstore is None or mapping is None):
        raise VectorStoreInputError(
            f"the index holds {count} vectors: pass docstore and index_to_docstore_id too")
    ids: list[str] = []
    for row, label in enumerate(labels):
        doc_id = mapping.get(label) if mapping is not None else None
        if doc_id is None:
            raise VectorStoreInputError(f"index_to_docstore_id has no id for row {row}")
        found = docstore.search(doc_id)
        if not isinstance(found, Document):
            raise VectorStoreInputError(f"docstore has no document for id {doc_id!r}")
        ids.append(str(doc_id))
        state.docs[str(doc_id)] = Document(id=str(doc_id), page_content=found.page_content,
                                           metadata=dict(found.metadata))
    if len(set(ids)) != len(ids):
        raise VectorStoreInputError("index_to_docstore_id maps several rows to one id")
    state.install(backend, ids, state.docs)


def _from_faiss_object(options: IndexOptions, strategy: DistanceStrategy,
                       index: Any) -> tuple[FlatIndex | FaissIndex, list[int]]:
    import torch

    from langchain_ascend.index.faiss_io import (
        FaissIndex,
        flat_vectors,
        import_faiss,
        metric_of,
    )

    faiss = import_faiss()
    source_metric = metric_of(index)
    if options.metric != "cosine" and source_metric != options.metric:
        raise VectorStoreInputError(
            f"the faiss index uses {source_metric.upper()} but distance_strategy is "
            f"{strategy.value}; pass the matching distance_strategy")
    vectors = flat_vectors(index)
    if vectors is not None and options.index_type != "faiss":
        backend = options.new_index(int(index.d))
        backend.add(torch.from_numpy(vectors).to(options.device))
        return backend, list(range(len(vectors)))
    concrete = faiss.downcast_index(index)
    labels = None
    if isinstance(concrete, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        labels = faiss.vector_to_array(concrete.id_map).astype(np.int64)
    options.index_type = "faiss"
    backend = FaissIndex(concrete, options.metric, device=options.device, row_labels=labels)
    return backend, [int(x) for x in backend.row_labels]


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


def merge_input(target: Any, strategy: DistanceStrategy,
                dim: int | None) -> tuple[list[str], list[Document], Any]:
    """ids, documents and (N, D) vectors of ``target`` (an AscendFAISS or an lc FAISS) to
    merge into a store of ``strategy`` and ``dim``.

    Raises:
        VectorStoreInputError: Different strategies, or ``target`` is no such store.
        EmbeddingDimensionError: Different vector dimensions.
    """
    state = getattr(target, "_state", None)
    if isinstance(state, StoreState):
        ids, docs, vectors = state.export()
        other = target.distance_strategy
    else:
        ids, docs, vectors, other = read_foreign_store(target)
    if as_strategy(other) != strategy:
        raise VectorStoreInputError(
            f"cannot merge a {as_strategy(other).value} store into a {strategy.value} store")
    if ids:
        assert vectors is not None
        if dim is not None and vectors.shape[1] != dim:
            raise EmbeddingDimensionError(
                f"cannot merge vectors of dimension {vectors.shape[1]} into an index of "
                f"dimension {dim}")
    return ids, docs, vectors


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
