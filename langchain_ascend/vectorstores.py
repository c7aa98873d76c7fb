"""AscendFAISS: a drop-in for ``langchain_community`` FAISS whose index lives on the device.

Swap the import and keep the code::

    from langchain_ascend import AscendEmbeddings, AscendFAISS

    store = AscendFAISS.from_texts(["foo", "bar"], AscendEmbeddings())
    store.similarity_search_with_score("foo", k=1)
    # [(Document(id='...', metadata={}, page_content='foo'), 0.0)]

The LangChain surface lives here; the search work lives in :mod:`langchain_ascend.index`.
torch is imported lazily (by the index modules and :mod:`langchain_ascend.platform`).
"""

from __future__ import annotations

import contextvars
import logging
import tempfile
import threading
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from langchain_ascend.errors import (
    EmbeddingDimensionError,
    IndexFormatError,
    UnsafeDeserializationError,
    VectorStoreInputError,
)
from langchain_ascend.index.distance import DistanceStrategy, as_strategy, metric_of_strategy
from langchain_ascend.index.docstore import DocumentStore, RowIdView
from langchain_ascend.index.filters import FilterSpec, MetadataColumns, Node, parse_filter

if TYPE_CHECKING:
    import torch

    from langchain_ascend.index.device_index import FlatIndex
    from langchain_ascend.index.faiss_io import FaissIndex

logger = logging.getLogger(__name__)

__all__ = ["AscendFAISS", "AscendFAISSRetriever", "DistanceStrategy"]

INDEX_TYPES = ("flat", "ivf", "faiss")
_DANGEROUS_MESSAGE = (
    "this folder was written by langchain_community FAISS and loading it unpickles "
    "{path}; pickle files can run arbitrary code. Pass allow_dangerous_deserialization=True "
    "only for a folder you created or trust (then re-save it with save_local to get a "
    "pickle-free copy)."
)

ScoredDocs = list[tuple[Document, float]]


class AscendFAISS(VectorStore):
    """Vector store with the ``langchain_community`` FAISS API, searched on the device.

    The vectors sit in one device tensor (float32 by default; ``dtype="float16"`` /
    ``"bfloat16"`` to halve memory); exact search is one matmul + top-k per batch of queries.
    Metadata filters become a device mask applied before top-k, so ``k`` results come back
    whenever ``k`` documents match. Ids are unique: adding an existing id replaces it (upsert);
    deleting an unknown id is a no-op. Saving writes safetensors + JSON, never pickle.

    Scores match lc FAISS for the same data: EUCLIDEAN returns SQUARED L2 distance (lower is
    better), MAX_INNER_PRODUCT the inner product (higher is better). COSINE is a real cosine:
    the score is the cosine distance ``1 - cos`` (lower is better) and the relevance score is
    ``cos`` (lc FAISS searches an L2 index for COSINE and reports ``1 - squared_L2``).

    ``score_threshold`` has two meanings, as in lc FAISS: passed to ``similarity_search*`` it
    bounds the raw score (distance ``<=`` threshold; inner product ``>=`` threshold); passed to
    ``similarity_search_with_relevance_scores`` or a ``"similarity_score_threshold"`` retriever
    it is a minimum relevance score.

    Args:
        embedding_function: The embedding model (positional, as in lc FAISS).
        index: None (built on first add), one of our indexes, or a faiss index to adopt: a
            flat faiss index is copied to the device; any other stays a faiss index.
        docstore: With ``index``: where the documents of its rows are (anything with
            ``search(id)``).
        index_to_docstore_id: With ``index``: row -> document id.
        relevance_score_fn: Overrides the relevance function of the distance strategy.
        normalize_L2: L2-normalise vectors and queries (as lc FAISS does).
        distance_strategy: EUCLIDEAN_DISTANCE (default), MAX_INNER_PRODUCT, DOT_PRODUCT or
            COSINE; lc's enum members are accepted.
        embedding: Keyword alias of ``embedding_function``: ``AscendFAISS(embedding=emb)``.
        device: ``"auto"`` (NPU, else CUDA, else CPU), ``"npu:0"``, ``"cuda"``, ``"cpu"``.
        dtype: Storage dtype of the device index: ``"float32"``, ``"float16"``, ``"bfloat16"``.
        index_type: ``"flat"`` (exact), ``"ivf"`` (k-means lists on the device, approximate)
            or ``"faiss"`` (a faiss-cpu index built from ``faiss_factory``, for corpora that
            do not fit device memory). Never switched silently.
        nlist: IVF lists (None: ``4 * sqrt(N)`` when trained).
        nprobe: Lists probed per query (IVF and faiss IVF indexes).
        faiss_factory: faiss factory string for ``index_type="faiss"``, e.g. ``"IVF4096,PQ64"``.
        ivf_min_train_size: IVF trains once it holds this many vectors (searches are exact
            before that); None means ``8 * nlist`` or 1,024.

    Raises:
        VectorStoreInputError: Conflicting or unknown options.
        DeviceUnavailableError: An explicit device that cannot be used.
    """

    def __init__(
        self,
        embedding_function: Embeddings | Callable[[str], list[float]] | None = None,
        index: Any = None,
        docstore: Any = None,
        index_to_docstore_id: Mapping[int, str] | None = None,
        relevance_score_fn: Callable[[float], float] | None = None,
        normalize_L2: bool = False,  # noqa: N803 - lc FAISS's argument name
        distance_strategy: Any = DistanceStrategy.EUCLIDEAN_DISTANCE,
        *,
        embedding: Embeddings | None = None,
        device: Any = "auto",
        dtype: Any = "float32",
        index_type: str = "flat",
        nlist: int | None = None,
        nprobe: int | None = None,
        faiss_factory: str = "Flat",
        ivf_min_train_size: int | None = None,
    ) -> None:
        from langchain_ascend.platform import resolve_device, resolve_dtype

        if embedding is not None and embedding_function is not None and (
                embedding is not embedding_function):
            raise VectorStoreInputError("pass either embedding_function or embedding, not both")
        if index_type not in INDEX_TYPES:
            raise VectorStoreInputError(
                f"unknown index_type {index_type!r}: use one of {', '.join(INDEX_TYPES)}")
        self._embedding = embedding if embedding is not None else embedding_function
        self.distance_strategy = as_strategy(distance_strategy)
        self._metric = metric_of_strategy(self.distance_strategy)
        self.override_relevance_score_fn = relevance_score_fn
        self._normalize_L2 = bool(normalize_L2)
        if self._normalize_L2 and self.distance_strategy != DistanceStrategy.EUCLIDEAN_DISTANCE:
            warnings.warn(f"Normalizing L2 is not applicable for metric type: "
                          f"{self.distance_strategy}", stacklevel=2)
        self._device = resolve_device(device)
        try:
            self._dtype = resolve_dtype(dtype, self._device)
        except ValueError as exc:
            raise VectorStoreInputError(str(exc)) from None
        self._index_type = index_type
        self._nlist = nlist
        self._nprobe = nprobe
        self._faiss_factory = faiss_factory
        self._ivf_min_train_size = ivf_min_train_size
        self._index: FlatIndex | FaissIndex | None = None
        self._docs: dict[str, Document] = {}
        self._row_ids: list[str] = []
        self._id_to_row: dict[str, int] = {}
        self._columns: MetadataColumns | None = None
        self._lock = threading.RLock()
        if index is not None:
            self._adopt(index, docstore, index_to_docstore_id)

    # ---- properties -------------------------------------------------------------------------
    @property
    def embeddings(self) -> Embeddings | None:
        """The embedding model (None for a plain callable or no embedding)."""
        return self._embedding if isinstance(self._embedding, Embeddings) else None

    @property
    def embedding_function(self) -> Embeddings | Callable[[str], list[float]] | None:
        """The embedding model or callable, as in lc FAISS."""
        return self._embedding

    @property
    def index(self) -> FlatIndex | FaissIndex | None:
        """The search index (``.ntotal`` as in faiss); None until the first add."""
        return self._index

    @property
    def docstore(self) -> DocumentStore:
        """Documents by id (read-only use: ``docstore.search(id)``)."""
        return DocumentStore(self._docs)

    @property
    def index_to_docstore_id(self) -> Mapping[int, str]:
        """Read-only row -> id mapping."""
        return RowIdView(lambda: self._row_ids)

    @property
    def device(self) -> torch.device:
        """Where the vectors live."""
        return self._device

    @property
    def dim(self) -> int | None:
        """Vector dimension (None before the first add)."""
        return None if self._index is None else self._index.dim

    def __len__(self) -> int:
        return len(self._row_ids)

    # ---- index construction ----------------------------------------------------------------
    def _new_index(self, dim: int) -> FlatIndex | FaissIndex:
        from langchain_ascend.index.device_index import FlatIndex
        from langchain_ascend.index.faiss_io import FaissIndex
        from langchain_ascend.index.ivf import IVFIndex

        if self._index_type == "ivf":
            return IVFIndex(dim, self._metric, device=self._device, dtype=self._dtype,
                            nlist=self._nlist, nprobe=self._nprobe,
                            min_train_size=self._ivf_min_train_size)
        if self._index_type == "faiss":
            return FaissIndex.create(self._faiss_factory, dim, self._metric, device=self._device,
                                     nprobe=self._nprobe)
        return FlatIndex(dim, self._metric, device=self._device, dtype=self._dtype)

    def _adopt(self, index: Any, docstore: Any, mapping: Mapping[int, str] | None) -> None:
        """Take over a populated index plus its documents (lc FAISS construction)."""
        from langchain_ascend.index.device_index import FlatIndex
        from langchain_ascend.index.faiss_io import FaissIndex

        if isinstance(index, (FlatIndex, FaissIndex)):
            backend = index
            labels = list(range(backend.ntotal))
        else:
            backend, labels = self._from_faiss_object(index)
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
            self._docs[str(doc_id)] = Document(id=str(doc_id), page_content=found.page_content,
                                               metadata=dict(found.metadata))
        if len(set(ids)) != len(ids):
            raise VectorStoreInputError("index_to_docstore_id maps several rows to one id")
        self._index = backend
        self._row_ids = ids
        self._id_to_row = {doc_id: row for row, doc_id in enumerate(ids)}

    def _from_faiss_object(self, index: Any) -> tuple[FlatIndex | FaissIndex, list[int]]:
        import numpy as np
        import torch

        from langchain_ascend.index.faiss_io import (
            FaissIndex,
            flat_vectors,
            import_faiss,
            metric_of,
        )

        faiss = import_faiss()
        source_metric = metric_of(index)
        if self._metric != "cosine" and source_metric != self._metric:
            raise VectorStoreInputError(
                f"the faiss index uses {source_metric.upper()} but distance_strategy is "
                f"{self.distance_strategy.value}; pass the matching distance_strategy")
        vectors = flat_vectors(index)
        if vectors is not None and self._index_type != "faiss":
            backend = self._new_index(int(index.d))
            backend.add(torch.from_numpy(vectors).to(self._device))
            return backend, list(range(len(vectors)))
        concrete = faiss.downcast_index(index)
        labels = None
        if isinstance(concrete, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            labels = faiss.vector_to_array(concrete.id_map).astype(np.int64)
        self._index_type = "faiss"
        backend = FaissIndex(concrete, self._metric, device=self._device, row_labels=labels)
        return backend, [int(x) for x in backend.row_labels]

    # ---- embedding helpers ------------------------------------------------------------------
    def _require_embedding(self) -> Any:
        if self._embedding is None:
            raise VectorStoreInputError(
                "this store has no embedding model: pass embedding=... or use the *_by_vector "
                "methods")
        return self._embedding

    def _embed_documents(self, texts: list[str]) -> Any:
        emb = self._require_embedding()
        if hasattr(emb, "embed_documents_tensor"):
            return emb.embed_documents_tensor(texts)
        if isinstance(emb, Embeddings):
            return emb.embed_documents(texts)
        return [emb(text) for text in texts]

    async def _aembed_documents(self, texts: list[str]) -> Any:
        emb = self._require_embedding()
        if hasattr(emb, "aembed_documents_tensor"):
            return await emb.aembed_documents_tensor(texts)
        if isinstance(emb, Embeddings):
            return await emb.aembed_documents(texts)
        return await run_in_executor(None, lambda: [emb(text) for text in texts])

    def _embed_queries(self, queries: list[str]) -> Any:
        emb = self._require_embedding()
        if hasattr(emb, "embed_queries_tensor"):
            return emb.embed_queries_tensor(queries)
        if isinstance(emb, Embeddings):
            return [emb.embed_query(q) for q in queries]
        return [emb(q) for q in queries]

    async def _aembed_queries(self, queries: list[str]) -> Any:
        emb = self._require_embedding()
        if hasattr(emb, "aembed_queries_tensor"):
            return await emb.aembed_queries_tensor(queries)
        if isinstance(emb, Embeddings):
            return [await emb.aembed_query(q) for q in queries]
        return await run_in_executor(None, self._embed_queries, queries)

    # ---- writes -------------------------------------------------------------------------------
    def _validated_rows(self, texts: list[str], metadatas: Any,
                        ids: Any) -> tuple[list[str], list[dict[str, Any]]]:
        count = len(texts)
        metas = [{} for _ in range(count)] if metadatas is None else list(metadatas)
        if len(metas) != count:
            raise VectorStoreInputError(
                f"texts and metadatas expected to be equal length but len(texts)={count} and "
                f"len(metadatas)={len(metas)}")
        for i, meta in enumerate(metas):
            if meta is not None and not isinstance(meta, Mapping):
                raise VectorStoreInputError(
                    f"metadata at position {i} must be a dict, got {type(meta).__name__}")
        id_list = [None] * count if ids is None else list(ids)
        if len(id_list) != count:
            raise VectorStoreInputError(
                f"texts and ids expected to be equal length but len(texts)={count} and "
                f"len(ids)={len(id_list)}")
        final_ids = [str(uuid.uuid4()) if i is None else str(i) for i in id_list]
        if len(set(final_ids)) != count:
            dupes = sorted(i for i, n in Counter(final_ids).items() if n > 1)
            raise VectorStoreInputError(f"Duplicate ids found in the ids list: {dupes}")
        return final_ids, [dict(m or {}) for m in metas]

    def _add(self, texts: Iterable[str], vectors: Any, metadatas: Any = None,
             ids: Any = None) -> list[str]:
        """Validate everything, then write vectors, rows and documents (upsert by id)."""
        import torch

        from langchain_ascend.index.device_index import FlatIndex, l2_normalize, to_matrix

        texts = [str(t) for t in texts]
        final_ids, metas = self._validated_rows(texts, metadatas, ids)
        matrix = to_matrix(vectors, device=self._device, dim=self.dim)
        if matrix.shape[0] != len(texts):
            raise VectorStoreInputError(
                f"got {matrix.shape[0]} embeddings for {len(texts)} texts")
        if not texts:
            return []
        if self._normalize_L2:
            matrix = l2_normalize(matrix)
        docs = [Document(id=i, page_content=t, metadata=m)
                for i, t, m in zip(final_ids, texts, metas, strict=True)]
        with self._lock:
            if self._index is None:
                index = self._new_index(int(matrix.shape[1]))
            else:
                index = self._index
            existing = [j for j, i in enumerate(final_ids) if i in self._id_to_row]
            if existing and isinstance(index, FlatIndex):  # in-place upsert on the device
                rows = torch.tensor([self._id_to_row[final_ids[j]] for j in existing])
                positions = torch.tensor(existing, device=matrix.device)
                index.update(rows, matrix.index_select(0, positions))
                fresh = [j for j, i in enumerate(final_ids) if i not in self._id_to_row]
                stale_rows: list[int] = []
            else:
                fresh = list(range(len(final_ids)))
                stale_rows = [self._id_to_row[final_ids[j]] for j in existing]
            if fresh:
                positions = torch.tensor(fresh, device=matrix.device)
                index.add(matrix if len(fresh) == len(final_ids)
                          else matrix.index_select(0, positions))
            self._index = index
            self._row_ids.extend(final_ids[j] for j in fresh)
            if stale_rows:
                self._remove_rows(stale_rows)
            else:
                for j in fresh:
                    self._id_to_row[final_ids[j]] = len(self._id_to_row)
            self._docs.update(zip(final_ids, docs, strict=True))
            self._columns = None
        return final_ids

    def _remove_rows(self, rows: Sequence[int]) -> None:
        """Delete rows from the index and the row list; rebuild the id -> row map."""
        import torch

        assert self._index is not None
        drop = sorted(set(rows))
        self._index.remove(torch.tensor(drop, dtype=torch.int64))
        dropped = set(drop)
        self._row_ids = [doc_id for row, doc_id in enumerate(self._row_ids) if row not in dropped]
        self._id_to_row = {doc_id: row for row, doc_id in enumerate(self._row_ids)}
        self._columns = None

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Embed and add texts; an id already in the store is replaced.

        Returns:
            The ids of the added texts.
        """
        texts = list(texts)
        if not texts:
            self._validated_rows(texts, metadatas, ids)
            return []
        return self._add(texts, self._embed_documents(texts), metadatas, ids)

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Async :meth:`add_texts` (embedding awaited, the index write in an executor)."""
        texts = list(texts)
        if not texts:
            self._validated_rows(texts, metadatas, ids)
            return []
        vectors = await self._aembed_documents(texts)
        return await run_in_executor(None, self._add, texts, vectors, metadatas, ids)

    def add_embeddings(self, text_embeddings: Iterable[tuple[str, Any]],
                       metadatas: list[dict] | None = None, ids: list[str] | None = None,
                       **kwargs: Any) -> list[str]:
        """Add ``(text, vector)`` pairs without embedding (vectors may also be numpy rows)."""
        pairs = list(text_embeddings)
        return self._add([text for text, _ in pairs], [vec for _, vec in pairs], metadatas, ids)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id; unknown ids are ignored.

        Raises:
            VectorStoreInputError: ``ids`` is None (as lc FAISS, which raises ValueError).
        """
        if ids is None:
            raise VectorStoreInputError("No ids provided to delete.")
        with self._lock:
            rows = [self._id_to_row[i] for i in set(ids) if i in self._id_to_row]
            if rows:
                self._remove_rows(rows)
            for doc_id in ids:
                self._docs.pop(doc_id, None)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked."""
        with self._lock:
            return [self._docs[i] for i in ids if i in self._docs]

    # ---- search core --------------------------------------------------------------------------
    def _mask(self, node: Node | None) -> torch.Tensor | None:
        """(N,) device mask of the rows a parsed filter keeps; caller holds the lock."""
        if node is None:
            return None
        if self._columns is None:
            self._columns = MetadataColumns([self._docs[i].metadata for i in self._row_ids],
                                            self._device)
        return self._columns.mask(node)

    def _search_rows(self, queries: Any, k: int, filter: FilterSpec | None,
                     ) -> list[list[tuple[int, float]]]:
        """(row, raw score) lists per query; caller holds the lock."""
        from langchain_ascend.index.device_index import l2_normalize, to_matrix

        node = None if filter is None else parse_filter(filter)
        if k < 0:
            raise VectorStoreInputError(f"k must be >= 0, got {k}")
        matrix = to_matrix(queries, device=self._device, dim=self.dim)
        if self._index is None or self._index.ntotal == 0 or k == 0:
            return [[] for _ in range(matrix.shape[0])]
        if self._normalize_L2 or self._metric == "cosine":
            matrix = l2_normalize(matrix)
        result = self._index.search(matrix, k, self._mask(node))
        rows, scores = result.rows.tolist(), result.scores.tolist()
        return [[(r, s) for r, s in zip(row_list, score_list, strict=True) if r >= 0]
                for row_list, score_list in zip(rows, scores, strict=True)]

    def _threshold(self, pairs: ScoredDocs, score_threshold: float | None) -> ScoredDocs:
        if score_threshold is None:
            return pairs
        if self._metric == "ip":
            return [(d, s) for d, s in pairs if s >= score_threshold]
        return [(d, s) for d, s in pairs if s <= score_threshold]

    def similarity_search_with_score_by_vectors(
        self, embeddings: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Batch search: one matmul for all query vectors.

        Args:
            embeddings: (B, D) query vectors (lists, numpy or a tensor on any device).
            k: Results per query.
            filter: Metadata filter (dict or callable), applied before top-k.
            fetch_k: Accepted for lc compatibility (filters never need over-fetching here).
            **kwargs: ``score_threshold`` on the raw score.

        Returns:
            One ``[(Document, score), ...]`` list per query.
        """
        with self._lock:
            hits = self._search_rows(embeddings, k, filter)
            out = [[(self._docs[self._row_ids[r]], float(s)) for r, s in pairs] for pairs in hits]
        threshold = kwargs.get("score_threshold")
        return [self._threshold(pairs, threshold) for pairs in out]

    def similarity_search_with_score_by_vector(
        self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> ScoredDocs:
        """Documents most similar to a vector, with raw scores (see the class docstring)."""
        vector = embedding.reshape(1, -1) if hasattr(embedding, "reshape") else [embedding]
        return self.similarity_search_with_score_by_vectors(vector, k, filter, fetch_k,
                                                            **kwargs)[0]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> ScoredDocs:
        """Documents most similar to a query text, with raw scores."""
        return self.similarity_search_with_score_by_vectors(
            self._embed_queries([query]), k, filter, fetch_k, **kwargs)[0]

    def similarity_search_by_vector(
        self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[Document]:
        """Documents most similar to a vector."""
        return [d for d, _ in self.similarity_search_with_score_by_vector(
            embedding, k, filter, fetch_k, **kwargs)]

    def similarity_search(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> list[Document]:
        """Documents most similar to a query text."""
        return [d for d, _ in self.similarity_search_with_score(query, k, filter, fetch_k,
                                                                **kwargs)]

    def similarity_search_with_score_batch(
        self, queries: Sequence[str], k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Several query texts in one search call (one matmul); raw scores."""
        if not queries:
            return []
        return self.similarity_search_with_score_by_vectors(
            self._embed_queries(list(queries)), k, filter, fetch_k, **kwargs)

    def similarity_search_batch(
        self, queries: Sequence[str], k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[list[Document]]:
        """Several query texts in one search call (one matmul)."""
        return [[d for d, _ in pairs] for pairs in self.similarity_search_with_score_batch(
            queries, k, filter, fetch_k, **kwargs)]

    # ---- relevance scores ----------------------------------------------------------------------
    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """The relevance function lc FAISS uses for this distance strategy."""
        if self.override_relevance_score_fn is not None:
            return self.override_relevance_score_fn
        if self._metric == "ip":
            return self._max_inner_product_relevance_score_fn
        if self._metric == "cosine":
            return self._cosine_relevance_score_fn
        return self._euclidean_relevance_score_fn

    def _similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> ScoredDocs:
        relevance = self._select_relevance_score_fn()
        return [(d, relevance(s)) for d, s in self.similarity_search_with_score(
            query, k, filter=filter, fetch_k=fetch_k, **kwargs)]

    async def _asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> ScoredDocs:
        relevance = self._select_relevance_score_fn()
        return [(d, relevance(s)) for d, s in await self.asimilarity_search_with_score(
            query, k, filter=filter, fetch_k=fetch_k, **kwargs)]

    def similarity_search_with_relevance_scores_batch(
        self, queries: Sequence[str], k: int = 4, score_threshold: float | None = None,
        **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Batch version of ``similarity_search_with_relevance_scores`` (one matmul)."""
        relevance = self._select_relevance_score_fn()
        out = []
        for pairs in self.similarity_search_with_score_batch(queries, k, **kwargs):
            scored = [(d, relevance(s)) for d, s in pairs]
            if score_threshold is not None:
                scored = [(d, s) for d, s in scored if s >= score_threshold]
            out.append(scored)
        return out

    # ---- MMR -----------------------------------------------------------------------------------
    def _mmr_by_vectors(self, embeddings: Any, k: int, fetch_k: int, lambda_mult: float,
                        filter: FilterSpec | None) -> list[ScoredDocs]:
        import torch

        from langchain_ascend.index.device_index import to_matrix
        from langchain_ascend.index.mmr import mmr_select

        with self._lock:
            queries = to_matrix(embeddings, device=self._device, dim=self.dim)
            hits = self._search_rows(queries, fetch_k, filter)
            out: list[ScoredDocs] = []
            for q, pairs in zip(queries, hits, strict=True):
                if not pairs or k <= 0:
                    out.append([])
                    continue
                rows = torch.tensor([r for r, _ in pairs], dtype=torch.int64)
                assert self._index is not None
                chosen = mmr_select(q, self._index.reconstruct(rows), k, lambda_mult)
                out.append([(self._docs[self._row_ids[pairs[i][0]]], float(pairs[i][1]))
                            for i in chosen])
        return out

    def max_marginal_relevance_search_with_score_by_vector(
        self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None,
    ) -> ScoredDocs:
        """MMR over the ``fetch_k`` best matches (filter applied first), with their scores."""
        vector = embedding.reshape(1, -1) if hasattr(embedding, "reshape") else [embedding]
        return self._mmr_by_vectors(vector, k, fetch_k, lambda_mult, filter)[0]

    def max_marginal_relevance_search_by_vector(
        self, embedding: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[Document]:
        """Documents selected by maximal marginal relevance for a vector."""
        return [d for d, _ in self.max_marginal_relevance_search_with_score_by_vector(
            embedding, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter)]

    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[Document]:
        """Documents selected by maximal marginal relevance for a query text."""
        return [d for d, _ in self._mmr_by_vectors(
            self._embed_queries([query]), k, fetch_k, lambda_mult, filter)[0]]

    def max_marginal_relevance_search_batch(
        self, queries: Sequence[str], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[list[Document]]:
        """MMR for several query texts; the candidate search is one matmul."""
        if not queries:
            return []
        return [[d for d, _ in pairs] for pairs in self._mmr_by_vectors(
            self._embed_queries(list(queries)), k, fetch_k, lambda_mult, filter)]

    # ---- async search -------------------------------------------------------------------------
    async def asimilarity_search_with_score_by_vector(
        self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> ScoredDocs:
        """Async :meth:`similarity_search_with_score_by_vector` (runs in an executor)."""
        return await run_in_executor(None, lambda: self.similarity_search_with_score_by_vector(
            embedding, k, filter, fetch_k, **kwargs))

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> ScoredDocs:
        """Async :meth:`similarity_search_with_score` (embedding awaited)."""
        vectors = await self._aembed_queries([query])
        return (await run_in_executor(None, lambda: self.similarity_search_with_score_by_vectors(
            vectors, k, filter, fetch_k, **kwargs)))[0]

    async def asimilarity_search_by_vector(
        self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`similarity_search_by_vector`."""
        return [d for d, _ in await self.asimilarity_search_with_score_by_vector(
            embedding, k, filter, fetch_k, **kwargs)]

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`similarity_search`."""
        return [d for d, _ in await self.asimilarity_search_with_score(
            query, k, filter, fetch_k, **kwargs)]

    async def asimilarity_search_with_score_batch(
        self, queries: Sequence[str], k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Async :meth:`similarity_search_with_score_batch`."""
        if not queries:
            return []
        vectors = await self._aembed_queries(list(queries))
        return await run_in_executor(None, lambda: self.similarity_search_with_score_by_vectors(
            vectors, k, filter, fetch_k, **kwargs))

    async def asimilarity_search_batch(
        self, queries: Sequence[str], k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> list[list[Document]]:
        """Async :meth:`similarity_search_batch`."""
        return [[d for d, _ in pairs] for pairs in await self.asimilarity_search_with_score_batch(
            queries, k, filter, fetch_k, **kwargs)]

    async def amax_marginal_relevance_search_with_score_by_vector(
        self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None,
    ) -> ScoredDocs:
        """Async :meth:`max_marginal_relevance_search_with_score_by_vector`."""
        return await run_in_executor(
            None, lambda: self.max_marginal_relevance_search_with_score_by_vector(
                embedding, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter))

    async def amax_marginal_relevance_search_by_vector(
        self, embedding: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`max_marginal_relevance_search_by_vector`."""
        return [d for d, _ in await self.amax_marginal_relevance_search_with_score_by_vector(
            embedding, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter)]

    async def amax_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[Document]:
        """Async :meth:`max_marginal_relevance_search` (embedding awaited)."""
        vectors = await self._aembed_queries([query])
        pairs = await run_in_executor(
            None, lambda: self._mmr_by_vectors(vectors, k, fetch_k, lambda_mult, filter))
        return [d for d, _ in pairs[0]]

    async def amax_marginal_relevance_search_batch(
        self, queries: Sequence[str], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[list[Document]]:
        """Async :meth:`max_marginal_relevance_search_batch`."""
        if not queries:
            return []
        vectors = await self._aembed_queries(list(queries))
        results = await run_in_executor(
            None, lambda: self._mmr_by_vectors(vectors, k, fetch_k, lambda_mult, filter))
        return [[d for d, _ in pairs] for pairs in results]

    async def asimilarity_search_with_relevance_scores_batch(
        self, queries: Sequence[str], k: int = 4, score_threshold: float | None = None,
        **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Async :meth:`similarity_search_with_relevance_scores_batch`."""
        relevance = self._select_relevance_score_fn()
        out = []
        for pairs in await self.asimilarity_search_with_score_batch(queries, k, **kwargs):
            scored = [(d, relevance(s)) for d, s in pairs]
            if score_threshold is not None:
                scored = [(d, s) for d, s in scored if s >= score_threshold]
            out.append(scored)
        return out

    # ---- merge ---------------------------------------------------------------------------------
    def merge_from(self, target: Any) -> None:
        """Add all documents and vectors of another store (ours or an lc FAISS).

        Raises:
            VectorStoreInputError: Ids present in both stores, or different strategies.
            EmbeddingDimensionError: Different vector dimensions.
        """
        import torch

        from langchain_ascend.index.store_io import read_foreign_store

        if isinstance(target, AscendFAISS):
            with target._lock:
                ids = list(target._row_ids)
                docs = [target._docs[i] for i in ids]
                vectors = (target._index.reconstruct(torch.arange(len(ids)))
                           if target._index is not None and ids else None)
                strategy = target.distance_strategy
        else:
            ids, docs, vectors, strategy = read_foreign_store(target)
        if as_strategy(strategy) != self.distance_strategy:
            raise VectorStoreInputError(
                f"cannot merge a {as_strategy(strategy).value} store into a "
                f"{self.distance_strategy.value} store")
        if not ids:
            return
        assert vectors is not None
        if self.dim is not None and vectors.shape[1] != self.dim:
            raise EmbeddingDimensionError(
                f"cannot merge vectors of dimension {vectors.shape[1]} into an index of "
                f"dimension {self.dim}")
        with self._lock:
            clash = sorted(set(ids) & set(self._id_to_row))
            if clash:
                raise VectorStoreInputError(f"ids present in both stores: {clash[:10]}")
            self._add([d.page_content for d in docs], vectors, [d.metadata for d in docs], ids)

    # ---- persistence ---------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        index = self._index
        config: dict[str, Any] = {
            "distance_strategy": self.distance_strategy.value,
            "normalize_L2": self._normalize_L2,
            "index_type": self._index_type,
            "dtype": str(self._dtype).removeprefix("torch."),
            "dim": self.dim,
            "num_vectors": len(self._row_ids),
            "nlist": self._nlist,
            "nprobe": self._nprobe,
            "faiss_factory": getattr(index, "factory", None) or self._faiss_factory,
            "ivf_min_train_size": self._ivf_min_train_size,
        }
        return config

    def save_local(self, folder_path: str | Path, index_name: str = "index") -> None:
        """Save to ``folder_path`` atomically (safetensors + JSON with checksums; no pickle).

        A crash during the save leaves the previous save loadable. See
        :mod:`langchain_ascend.index.persistence` for the layout.

        Raises:
            VectorStoreInputError: A metadata value cannot be stored (nothing is written).
        """
        from langchain_ascend.index.persistence import save_folder
        from langchain_ascend.index.store_io import snapshot

        with self._lock:
            documents = [self._docs[i] for i in self._row_ids]
            saved = snapshot(self._index, documents, self._config())
        save_folder(Path(folder_path), index_name, saved)

    @classmethod
    def load_local(cls, folder_path: str | Path, embeddings: Embeddings | None,
                   index_name: str = "index", *, allow_dangerous_deserialization: bool = False,
                   **kwargs: Any) -> AscendFAISS:
        """Load a folder saved by :meth:`save_local`, or by ``langchain_community`` FAISS.

        Our format needs no flag. An lc folder (``index.faiss`` + ``index.pkl``) needs
        ``allow_dangerous_deserialization=True`` exactly as in lc; its distance strategy is
        taken from the faiss index's metric unless ``distance_strategy`` is passed.

        Args:
            folder_path: The folder.
            embeddings: Embedding model for text queries.
            index_name: Name used at save time.
            allow_dangerous_deserialization: Permit unpickling an lc folder.
            **kwargs: Constructor options (``device``, ``dtype``, ``relevance_score_fn``...).

        Raises:
            IndexFormatError: Nothing saved under that name, or damaged files.
            ChecksumMismatchError: A file changed since it was saved.
            UnsafeDeserializationError: An lc folder without the flag.
        """
        from langchain_ascend.index.faiss_io import read_langchain_folder
        from langchain_ascend.index.persistence import has_saved_index, load_folder

        folder = Path(folder_path)
        if has_saved_index(folder, index_name):
            return cls._from_saved(load_folder(folder, index_name), embeddings, **kwargs)
        pkl = folder / f"{index_name}.pkl"
        if pkl.exists() or (folder / f"{index_name}.faiss").exists():
            if not allow_dangerous_deserialization:
                raise UnsafeDeserializationError(_DANGEROUS_MESSAGE.format(path=pkl))
            index, docstore, mapping = read_langchain_folder(folder, index_name)
            if "distance_strategy" not in kwargs:
                from langchain_ascend.index.faiss_io import metric_of

                kwargs["distance_strategy"] = (DistanceStrategy.MAX_INNER_PRODUCT
                                               if metric_of(index) == "ip"
                                               else DistanceStrategy.EUCLIDEAN_DISTANCE)
            return cls(embeddings, index, docstore, mapping, **kwargs)
        raise IndexFormatError(f"no saved index named {index_name!r} in {folder}")

    @classmethod
    def _from_saved(cls, saved: Any, embeddings: Embeddings | None,
                    **kwargs: Any) -> AscendFAISS:
        from langchain_ascend.index.store_io import restore_index

        config = saved.config
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
        store = cls(embeddings, **options)
        if len(saved.documents) != count:
            raise IndexFormatError(
                f"docstore.json holds {len(saved.documents)} documents, expected {count}")
        if count == 0:
            return store
        index = restore_index(saved, store._new_index, metric=store._metric,
                              device=store._device, factory=options["faiss_factory"],
                              count=count, dim=dim, index_type=store._index_type)
        if index.ntotal != count:
            raise IndexFormatError(f"index holds {index.ntotal} vectors, expected {count}")
        ids = [row["id"] for row in saved.documents]
        if len(set(ids)) != len(ids):
            raise IndexFormatError("docstore.json repeats a document id")
        store._index = index
        store._row_ids = ids
        store._id_to_row = {doc_id: row for row, doc_id in enumerate(ids)}
        store._docs = {row["id"]: Document(id=row["id"], page_content=row["page_content"],
                                           metadata=row["metadata"]) for row in saved.documents}
        return store

    def serialize_to_bytes(self) -> bytes:
        """The :meth:`save_local` folder as an uncompressed tar in memory (no pickle)."""
        from langchain_ascend.index.store_io import pack_tar

        with tempfile.TemporaryDirectory() as tmp:
            self.save_local(tmp)
            return pack_tar(Path(tmp))

    @classmethod
    def deserialize_from_bytes(cls, serialized: bytes, embeddings: Embeddings | None, *,
                               allow_dangerous_deserialization: bool = False,
                               **kwargs: Any) -> AscendFAISS:
        """Inverse of :meth:`serialize_to_bytes`.

        Raises:
            UnsafeDeserializationError: The bytes are an lc FAISS pickle (not supported
                without the flag; with it, they are loaded as lc does).
            IndexFormatError: The bytes are neither format.
        """
        from langchain_ascend.index.store_io import extract_tar

        if not serialized.startswith(b"\x80"):
            with tempfile.TemporaryDirectory() as tmp:
                extract_tar(serialized, Path(tmp))
                return cls.load_local(tmp, embeddings, **kwargs)
        if not allow_dangerous_deserialization:
            raise UnsafeDeserializationError(_DANGEROUS_MESSAGE.format(path="the given bytes"))
        import pickle

        index, docstore, mapping = pickle.loads(serialized)  # noqa: S301 - explicit opt-in
        return cls(embeddings, index, docstore, mapping, **kwargs)

    # ---- constructors --------------------------------------------------------------------------
    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings,
                   metadatas: list[dict] | None = None, ids: list[str] | None = None,
                   **kwargs: Any) -> AscendFAISS:
        """Embed texts and build a store (options as in the constructor).

        Raises:
            VectorStoreInputError: No texts (start empty with ``AscendFAISS(embedding=...)``).
        """
        texts = list(texts)
        _require_texts(texts)
        store = cls(embedding, **kwargs)
        store._add(texts, store._embed_documents(texts), metadatas, ids)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings,
                          metadatas: list[dict] | None = None, ids: list[str] | None = None,
                          **kwargs: Any) -> AscendFAISS:
        """Async :meth:`from_texts` (embedding awaited)."""
        texts = list(texts)
        _require_texts(texts)
        store = cls(embedding, **kwargs)
        vectors = await store._aembed_documents(texts)
        await run_in_executor(None, store._add, texts, vectors, metadatas, ids)
        return store

    @classmethod
    def from_embeddings(cls, text_embeddings: Iterable[tuple[str, Any]], embedding: Embeddings,
                        metadatas: Iterable[dict] | None = None, ids: list[str] | None = None,
                        **kwargs: Any) -> AscendFAISS:
        """Build a store from ``(text, vector)`` pairs."""
        pairs = list(text_embeddings)
        _require_texts(pairs)
        store = cls(embedding, **kwargs)
        store.add_embeddings(pairs, list(metadatas) if metadatas is not None else None, ids)
        return store

    @classmethod
    async def afrom_embeddings(cls, text_embeddings: Iterable[tuple[str, Any]],
                               embedding: Embeddings, metadatas: Iterable[dict] | None = None,
                               ids: list[str] | None = None, **kwargs: Any) -> AscendFAISS:
        """Async :meth:`from_embeddings`."""
        return await run_in_executor(None, lambda: cls.from_embeddings(
            text_embeddings, embedding, metadatas, ids, **kwargs))

    # ---- retriever -----------------------------------------------------------------------------
    def as_retriever(self, **kwargs: Any) -> AscendFAISSRetriever:
        """A retriever whose ``batch``/``abatch`` run one batched search for all queries.

        Args:
            **kwargs: ``search_type`` (``"similarity"``, ``"mmr"``,
                ``"similarity_score_threshold"``) and ``search_kwargs`` (``k``, ``filter``,
                ``score_threshold``, ``fetch_k``, ``lambda_mult``), as in LangChain.
        """
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return AscendFAISSRetriever(vectorstore=self, tags=tags, **kwargs)


def _require_texts(texts: Sequence[Any]) -> None:
    if not texts:
        raise VectorStoreInputError(
            "cannot build a store from no texts (the dimension is unknown); start an empty "
            "store with AscendFAISS(embedding=...) and add texts later")


_PRECOMPUTED: contextvars.ContextVar[dict[str, list[Document]] | None] = contextvars.ContextVar(
    "langchain_ascend_precomputed_retrievals", default=None)


class AscendFAISSRetriever(VectorStoreRetriever):
    """``VectorStoreRetriever`` whose ``batch``/``abatch`` search all queries in one call.

    Callbacks, tags and ``return_exceptions`` behave as in the base class: the results of
    the one batched search are handed to the per-query runs. If the batched search fails,
    each query runs on its own and reports its own error.
    """

    def _search_all(self, queries: list[str]) -> list[list[Document]]:
        store = self.vectorstore
        assert isinstance(store, AscendFAISS)
        kwargs = dict(self.search_kwargs)
        if self.search_type == "similarity":
            return store.similarity_search_batch(queries, **kwargs)
        if self.search_type == "similarity_score_threshold":
            return [[d for d, _ in pairs] for pairs in
                    store.similarity_search_with_relevance_scores_batch(queries, **kwargs)]
        return store.max_marginal_relevance_search_batch(queries, **kwargs)

    async def _asearch_all(self, queries: list[str]) -> list[list[Document]]:
        store = self.vectorstore
        assert isinstance(store, AscendFAISS)
        kwargs = dict(self.search_kwargs)
        if self.search_type == "similarity":
            return await store.asimilarity_search_batch(queries, **kwargs)
        if self.search_type == "similarity_score_threshold":
            return [[d for d, _ in pairs] for pairs in
                    await store.asimilarity_search_with_relevance_scores_batch(queries, **kwargs)]
        return await store.amax_marginal_relevance_search_batch(queries, **kwargs)

    @staticmethod
    def _batchable(inputs: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        return len(inputs) > 1 and not kwargs and all(isinstance(q, str) for q in inputs)

    def batch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None,
              *, return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """Retrieve for several queries with one batched search (see the class docstring)."""
        precomputed = None
        if self._batchable(inputs, kwargs):
            try:
                precomputed = dict(zip(inputs, self._search_all(list(inputs)), strict=True))
            except Exception:  # noqa: BLE001 - each query then reports its own error
                logger.debug("batched retrieval failed; retrieving one by one", exc_info=True)
        token = _PRECOMPUTED.set(precomputed)
        try:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        finally:
            _PRECOMPUTED.reset(token)

    async def abatch(self, inputs: list[str],
                     config: RunnableConfig | list[RunnableConfig] | None = None,
                     *, return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """Async :meth:`batch`."""
        precomputed = None
        if self._batchable(inputs, kwargs):
            try:
                precomputed = dict(zip(inputs, await self._asearch_all(list(inputs)),
                                             strict=True))
            except Exception:  # noqa: BLE001 - each query then reports its own error
                logger.debug("batched retrieval failed; retrieving one by one", exc_info=True)
        token = _PRECOMPUTED.set(precomputed)
        try:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions,
                                        **kwargs)
        finally:
            _PRECOMPUTED.reset(token)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        precomputed = _PRECOMPUTED.get()
        if precomputed is not None and not kwargs and query in precomputed:
            return list(precomputed[query])
        return super()._get_relevant_documents(query, run_manager=run_manager, **kwargs)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        precomputed = _PRECOMPUTED.get()
        if precomputed is not None and not kwargs and query in precomputed:
            return list(precomputed[query])
        return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)
