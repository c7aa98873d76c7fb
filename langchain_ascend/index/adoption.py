"""Taking over another store's rows: the index and docstore an lc FAISS is built from
(``AscendFAISS(emb, index, docstore, index_to_docstore_id)``), and the rows ``merge_from``
copies out of another store (ours or an lc FAISS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from langchain_core.documents import Document

from langchain_ascend.errors import EmbeddingDimensionError, VectorStoreInputError
from langchain_ascend.index.device_index import FlatIndex
from langchain_ascend.index.distance import DistanceStrategy, as_strategy
from langchain_ascend.index.faiss_io import (
    FaissIndex,
    concrete_index,
    flat_vectors,
    import_faiss,
    metric_of,
)
from langchain_ascend.index.store_state import IndexOptions, StoreState

if TYPE_CHECKING:
    import torch

Rows = tuple[list[str], list[Document], "torch.Tensor | None"]


def adopt(state: StoreState, options: IndexOptions, strategy: DistanceStrategy, index: Any,
          docstore: Any, mapping: Any) -> None:
    """Take over a populated index plus its documents (lc FAISS construction).

    A flat faiss index is copied to the device unless the store is a faiss store; any other
    faiss index stays one (``options.index_type`` becomes ``"faiss"``).

    Raises:
        VectorStoreInputError: Missing docstore or mapping, ids missing or repeated, or a
            faiss index of another metric.
    """
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
    concrete = concrete_index(index)
    labels = None
    if isinstance(concrete, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        labels = faiss.vector_to_array(concrete.id_map).astype(np.int64)
    options.index_type = "faiss"
    backend = FaissIndex(concrete, options.metric, device=options.device, row_labels=labels)
    return backend, [int(x) for x in backend.row_labels]


def checked_merge(rows: Rows, source_strategy: Any, strategy: DistanceStrategy,
                  dim: int | None) -> Rows:
    """The ``rows`` of a store of ``source_strategy``, once they fit a store of ``strategy``
    and ``dim``.

    Raises:
        VectorStoreInputError: Different strategies.
        EmbeddingDimensionError: Different vector dimensions.
    """
    ids, docs, vectors = rows
    if as_strategy(source_strategy) != strategy:
        raise VectorStoreInputError(
            f"cannot merge a {as_strategy(source_strategy).value} store into a "
            f"{strategy.value} store")
    if ids:
        assert vectors is not None
        if dim is not None and vectors.shape[1] != dim:
            raise EmbeddingDimensionError(
                f"cannot merge vectors of dimension {vectors.shape[1]} into an index of "
                f"dimension {dim}")
    return ids, docs, vectors


def foreign_rows(target: Any) -> tuple[Rows, Any]:
    """ids, documents and (N, D) vectors of an lc FAISS store, and its distance strategy.

    Raises:
        VectorStoreInputError: ``target`` is not an lc FAISS-like store or lacks documents.
    """
    import torch

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
    return (ids, docs, vectors), strategy
