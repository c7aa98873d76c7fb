"""The in-memory state of a vector store: its index, documents and row <-> id bookkeeping.

:class:`IndexOptions` says which index a store builds (and what a save records about it);
:class:`StoreState` holds the index, the documents by id, the id of every row and the filter
columns, and keeps them in step under one lock: writes upsert by id, deletes compact the rows.
:func:`validated_rows` checks a write's metadatas and ids before anything changes.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from langchain_ascend.errors import VectorStoreArgumentTypeError, VectorStoreInputError
from langchain_ascend.index.device_index import FlatIndex, l2_normalize, to_matrix
from langchain_ascend.index.faiss_io import FaissIndex
from langchain_ascend.index.filters import MetadataColumns, Node
from langchain_ascend.index.ivf import IVFIndex
from langchain_ascend.platform import resolve_device, resolve_dtype
from langchain_ascend.validation import STORE, as_items, check_count, check_device

if TYPE_CHECKING:
    import torch

INDEX_TYPES = ("flat", "ivf", "faiss")


@dataclass
class IndexOptions:
    """Which index a store builds on its first write (``index_type`` may become ``"faiss"``
    when a store adopts a non-flat faiss index)."""

    index_type: str
    metric: str
    device: Any
    dtype: Any
    nlist: int | None
    nprobe: int | None
    faiss_factory: str
    ivf_min_train_size: int | None

    @staticmethod
    def check_type(index_type: str) -> None:
        """Raise ``VectorStoreInputError`` for an ``index_type`` that is not one of ours."""
        if index_type not in INDEX_TYPES:
            raise VectorStoreInputError(
                f"unknown index_type {index_type!r}: use one of {', '.join(INDEX_TYPES)}")

    @classmethod
    def resolve(cls, index_type: str, metric: str, *, device: Any, dtype: Any,
                nlist: int | None, nprobe: int | None, faiss_factory: str,
                ivf_min_train_size: int | None) -> IndexOptions:
        """The options of a new store, its device and dtype resolved.

        Raises:
            VectorStoreInputError: A malformed device spelling, a dtype the device cannot
                hold, or a count that is not a positive int.
            DeviceUnavailableError: An explicit device that cannot be used.
        """
        if isinstance(device, str):  # the spelling ("cpu:1" is no device); existence below
            check_device(device, errors=STORE)
        resolved = resolve_device(device)
        try:
            resolved_dtype = resolve_dtype(dtype, resolved)
        except ValueError as exc:
            raise VectorStoreInputError(str(exc)) from None
        for name, value in (("nlist", nlist), ("nprobe", nprobe),
                            ("ivf_min_train_size", ivf_min_train_size)):
            check_count(name, value, allow_none=True, errors=STORE)
        return cls(index_type, metric, resolved, resolved_dtype, nlist, nprobe, faiss_factory,
                   ivf_min_train_size)

    def new_index(self, dim: int) -> FlatIndex | FaissIndex:
        """An empty index of the configured kind for ``dim``-dimensional vectors."""
        if self.index_type == "ivf":
            return IVFIndex(dim, self.metric, device=self.device, dtype=self.dtype,
                            nlist=self.nlist, nprobe=self.nprobe,
                            min_train_size=self.ivf_min_train_size)
        if self.index_type == "faiss":
            return FaissIndex.create(self.faiss_factory, dim, self.metric, device=self.device,
                                     nprobe=self.nprobe)
        return FlatIndex(dim, self.metric, device=self.device, dtype=self.dtype)

    def saved_config(self, index: Any, *, distance_strategy: str, normalize_L2: bool,  # noqa: N803
                     num_vectors: int) -> dict[str, Any]:
        """The ``config`` a save records (read back by ``persist.snapshot.options_from_config``)."""
        return {
            "distance_strategy": distance_strategy,
            "normalize_L2": normalize_L2,
            "index_type": self.index_type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "dim": None if index is None else index.dim,
            "num_vectors": num_vectors,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "faiss_factory": getattr(index, "factory", None) or self.faiss_factory,
            "ivf_min_train_size": self.ivf_min_train_size,
        }


def text_items(texts: Any, name: str = "texts") -> list[str]:
    """The texts of a write: a list of strings; a bare string, None or a non-string item is
    refused (a string would be stored letter by letter; wrap one text in a list)."""
    items = as_items(name, texts, str_is_item=False, error=VectorStoreArgumentTypeError,
                     what="a list of strings")
    assert items is not None
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise VectorStoreArgumentTypeError(
                f"{name}[{i}] must be a string, got {type(text).__name__} {text!r:.60}")
    return items


def id_items(ids: Any) -> list[str]:
    """Ids to look up or delete: a list, or one id as a bare string."""
    items = as_items("ids", ids, str_is_item=True, error=VectorStoreArgumentTypeError,
                     what="a list of ids")
    assert items is not None
    for i, doc_id in enumerate(items):
        # Writes store str(id), so an int id given back is looked up as that string.
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise VectorStoreArgumentTypeError(
                f"ids[{i}] must be a string id, got {type(doc_id).__name__} {doc_id!r:.60}")
    return [str(doc_id) for doc_id in items]


def split_pairs(text_embeddings: Any) -> tuple[list[str], list[Any]]:
    """Texts and vectors of ``(text, vector)`` pairs."""
    pairs = as_items("text_embeddings", text_embeddings, str_is_item=False,
                     error=VectorStoreArgumentTypeError, what="a list of (text, vector)")
    assert pairs is not None
    return [text for text, _ in pairs], [vec for _, vec in pairs]


def require_texts(texts: Sequence[Any]) -> None:
    """A store built from texts needs at least one: the first one gives the dimension."""
    if not texts:
        raise VectorStoreInputError(
            "cannot build a store from no texts (the dimension is unknown); start an empty "
            "store with AscendFAISS(embedding=...) and add texts later")


def texts_to_add(texts: Any, metadatas: Any, ids: Any) -> list[str]:
    """The texts of a write; an empty write is validated here (there is nothing to embed)."""
    items = text_items(texts)
    if not items:
        validated_rows(items, metadatas, ids)
    return items


def validated_rows(texts: list[str], metadatas: Any,
                   ids: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Final ids (a uuid4 for each missing one) and metadata dicts of a write.

    Raises:
        VectorStoreInputError: Lengths differ, a metadata is not a mapping, or ids repeat.
    """
    count = len(texts)
    metas = [{} for _ in range(count)] if metadatas is None else as_items(
        "metadatas", metadatas, str_is_item=False, error=VectorStoreArgumentTypeError,
        what="a list of dicts (one per text)")
    assert metas is not None
    if len(metas) != count:
        raise VectorStoreInputError(
            f"texts and metadatas expected to be equal length but len(texts)={count} and "
            f"len(metadatas)={len(metas)}")
    for i, meta in enumerate(metas):
        if meta is not None and not isinstance(meta, Mapping):
            raise VectorStoreInputError(
                f"metadata at position {i} must be a dict, got {type(meta).__name__}")
    # One id as a bare string is that id (never its letters).
    id_list = [None] * count if ids is None else as_items(
        "ids", ids, str_is_item=True, error=VectorStoreArgumentTypeError)
    assert id_list is not None
    if len(id_list) != count:
        raise VectorStoreInputError(
            f"texts and ids expected to be equal length but len(texts)={count} and "
            f"len(ids)={len(id_list)}")
    final_ids = [str(uuid.uuid4()) if i is None else str(i) for i in id_list]
    if len(set(final_ids)) != count:
        dupes = sorted(i for i, n in Counter(final_ids).items() if n > 1)
        raise VectorStoreInputError(f"Duplicate ids found in the ids list: {dupes}")
    return final_ids, [dict(m or {}) for m in metas]


HANDED_OUT_LIMIT = 1024
"""Most recently handed-out documents a filtered search checks against its columns."""


class RecentIds:
    """The ids of the last :data:`HANDED_OUT_LIMIT` documents handed out, oldest forgotten
    first (a filtered search checks each, so the check stays bounded however much is read)."""

    def __init__(self, limit: int = HANDED_OUT_LIMIT) -> None:
        self.limit = limit
        self._ids: dict[str, None] = {}  # insertion order = recency

    def add(self, doc_id: str) -> None:
        self._ids.pop(doc_id, None)
        self._ids[doc_id] = None
        if len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def update(self, ids: Any) -> None:
        for doc_id in ids:
            self.add(doc_id)

    def difference_update(self, ids: Any) -> None:
        for doc_id in ids:
            self._ids.pop(doc_id, None)

    def clear(self) -> None:
        self._ids.clear()

    def __iter__(self) -> Any:
        return iter(list(self._ids))

    def __len__(self) -> int:
        return len(self._ids)


class StoreState:
    """Index, documents, row ids and filter columns of one store, changed under ``lock``.

    Row ``r`` of the index holds the vector of document ``row_ids[r]``; ``id_to_row`` is the
    inverse. The filter columns are built on the first filtered search after a write.

    Documents are handed to callers as the stored objects (as lc FAISS does), so a caller may
    change their metadata; ``handed_out`` names the last :data:`HANDED_OUT_LIMIT` of them,
    and a filtered search first checks those rows against the columns (rebuilt when one
    changed): dict filters then see what callable filters see (a change to a document handed
    out longer ago, or inside a nested value, is seen after the next write).
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.index: FlatIndex | FaissIndex | None = None
        self.docs: dict[str, Document] = {}
        self.row_ids: list[str] = []
        self.id_to_row: dict[str, int] = {}
        self.columns: MetadataColumns | None = None
        self.handed_out = RecentIds()
        self.lock = threading.RLock()

    @property
    def dim(self) -> int | None:
        """Vector dimension (None before the first write)."""
        return None if self.index is None else self.index.dim

    def install(self, index: FlatIndex | FaissIndex, ids: list[str],
                docs: dict[str, Document]) -> None:
        """Take over a populated index whose row ``r`` holds ``docs[ids[r]]``."""
        self.index = index
        self.row_ids = ids
        self.id_to_row = {doc_id: row for row, doc_id in enumerate(ids)}
        self.docs = docs
        self.columns = None
        self.handed_out.clear()

    def add(self, texts: Any, vectors: Any, metadatas: Any, ids: Any, *, normalize: bool,
            new_index: Callable[[int], FlatIndex | FaissIndex]) -> list[str]:
        """Validate a whole write (texts, one vector per text, metadatas, ids), then write its
        vectors, rows and documents (upsert by id); returns the ids."""
        texts = text_items(texts)
        final_ids, metas = validated_rows(texts, metadatas, ids)
        matrix = to_matrix(vectors, device=self.device, dim=self.dim)
        if matrix.shape[0] != len(texts):
            raise VectorStoreInputError(
                f"got {matrix.shape[0]} embeddings for {len(texts)} texts")
        if not texts:
            return []
        if normalize:
            matrix = l2_normalize(matrix)
        docs = [Document(id=i, page_content=t, metadata=m)
                for i, t, m in zip(final_ids, texts, metas, strict=True)]
        self.upsert(final_ids, docs, matrix, new_index)
        return final_ids

    def check_new_ids(self, ids: Sequence[str]) -> None:
        """Raise ``VectorStoreInputError`` when one of ``ids`` is stored already (a merge
        never replaces); caller holds the lock."""
        clash = sorted(set(ids) & set(self.id_to_row))
        if clash:
            raise VectorStoreInputError(f"ids present in both stores: {clash[:10]}")

    def upsert(self, final_ids: list[str], docs: Sequence[Document], matrix: torch.Tensor,
               new_index: Callable[[int], FlatIndex | FaissIndex]) -> None:
        """Write validated rows: a flat index overwrites known ids in place, other indexes
        add the new vectors and then drop the stale rows (an index that cannot drop rows
        refuses a write replacing an id before it adds anything)."""
        import torch

        with self.lock:
            index = self.index if self.index is not None else new_index(int(matrix.shape[1]))
            existing = [j for j, i in enumerate(final_ids) if i in self.id_to_row]
            if existing and isinstance(index, FlatIndex):  # in-place upsert on the device
                rows = torch.tensor([self.id_to_row[final_ids[j]] for j in existing])
                positions = torch.tensor(existing, device=matrix.device)
                index.update(rows, matrix.index_select(0, positions))
                fresh = [j for j, i in enumerate(final_ids) if i not in self.id_to_row]
                stale_rows: list[int] = []
            else:
                fresh = list(range(len(final_ids)))
                stale_rows = [self.id_to_row[final_ids[j]] for j in existing]
                if stale_rows and isinstance(index, FaissIndex) and not index.can_remove:
                    raise index.cannot_remove_error(  # before anything is written
                        f"ids already in the store ({[final_ids[j] for j in existing][:10]}) "
                        "cannot be replaced (nothing was written): add them under new ids, or "
                        "use a Flat / IVF index")
            if fresh:
                positions = torch.tensor(fresh, device=matrix.device)
                index.add(matrix if len(fresh) == len(final_ids)
                          else matrix.index_select(0, positions))
            self.index = index
            self.row_ids.extend(final_ids[j] for j in fresh)
            if stale_rows:
                self.remove_rows(stale_rows)
            else:
                for j in fresh:
                    self.id_to_row[final_ids[j]] = len(self.id_to_row)
            self.docs.update(zip(final_ids, docs, strict=True))
            self.handed_out.difference_update(final_ids)
            self.columns = None

    def remove_rows(self, rows: Sequence[int]) -> None:
        """Delete rows from the index and the row list; rebuild the id -> row map."""
        import torch

        assert self.index is not None
        drop = sorted(set(rows))
        self.index.remove(torch.tensor(drop, dtype=torch.int64))
        dropped = set(drop)
        self.row_ids = [doc_id for row, doc_id in enumerate(self.row_ids) if row not in dropped]
        self.id_to_row = {doc_id: row for row, doc_id in enumerate(self.row_ids)}
        self.columns = None

    def delete(self, ids: Iterable[str]) -> None:
        """Delete documents by id (one id as a bare string is that id); unknown ids are
        ignored."""
        ids = id_items(ids)
        with self.lock:
            rows = [self.id_to_row[i] for i in set(ids) if i in self.id_to_row]
            if rows:
                self.remove_rows(rows)
            for doc_id in ids:
                self.docs.pop(doc_id, None)
            self.handed_out.difference_update(ids)

    def get_by_ids(self, ids: Sequence[str]) -> list[Document]:
        """Documents for the ids that exist, in the order asked (one id may be a string)."""
        wanted = id_items(ids)
        with self.lock:
            found = [i for i in wanted if i in self.docs]
            self.handed_out.update(found)
            return [self.docs[i] for i in found]

    def hand_out(self, doc_id: str) -> Document | None:
        """The stored document of ``doc_id`` (None if there is none), noted as given to a
        caller, who may change its metadata (see the class docstring)."""
        with self.lock:
            doc = self.docs.get(doc_id)
            if doc is not None:
                self.handed_out.add(doc_id)
            return doc

    def doc_at(self, row: int) -> Document:
        """The document of ``row``, noted as :meth:`hand_out` does; caller holds the lock."""
        doc_id = self.row_ids[row]
        self.handed_out.add(doc_id)
        return self.docs[doc_id]

    def documents(self) -> list[Document]:
        """Documents in row order; caller holds the lock."""
        return [self.docs[i] for i in self.row_ids]

    def export(self) -> tuple[list[str], list[Document], torch.Tensor | None]:
        """Ids, documents and (N, D) vectors in row order (for a merge into another store)."""
        import torch

        with self.lock:
            ids = list(self.row_ids)
            docs = [self.docs[i] for i in ids]
            vectors = (self.index.reconstruct(torch.arange(len(ids)))
                       if self.index is not None and ids else None)
        return ids, docs, vectors

    def mask(self, node: Node | None) -> torch.Tensor | None:
        """(N,) device mask of the rows a parsed filter keeps; caller holds the lock."""
        if node is None:
            return None
        if self.columns is not None and not self._columns_current(self.columns):
            self.columns = None  # a caller changed a returned document's metadata
        if self.columns is None:
            self.columns = MetadataColumns([self.docs[i].metadata for i in self.row_ids],
                                           self.device)
        return self.columns.mask(node)

    def _columns_current(self, columns: MetadataColumns) -> bool:
        """Whether the documents handed out still hold what ``columns`` encoded for them
        (one check per handed-out row and built column); caller holds the lock."""
        return all(columns.row_is_current(self.id_to_row[i], self.docs[i].metadata)
                   for i in self.handed_out if i in self.id_to_row)
