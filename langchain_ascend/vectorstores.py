"""AscendFAISS: a drop-in for ``langchain_community`` FAISS whose index lives on the device.

Swap the import and keep the code::

    from langchain_ascend import AscendEmbeddings, AscendFAISS

    store = AscendFAISS.from_texts(["foo", "bar"], AscendEmbeddings())
    store.similarity_search_with_score("foo", k=1)
    # [(Document(id='...', metadata={}, page_content='foo'), 0.0)]

The LangChain surface lives here; the work lives in :mod:`langchain_ascend.index` (state and
writes, search, persistence, adoption of lc FAISS stores). torch is imported lazily.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore

from langchain_ascend.errors import VectorStoreInputError
from langchain_ascend.index import embedding_calls, persist, search
from langchain_ascend.index.adoption import adopt, checked_merge, foreign_rows
from langchain_ascend.index.distance import DistanceStrategy, as_strategy, metric_of_strategy
from langchain_ascend.index.docstore import DocumentStore, RowIdView
from langchain_ascend.index.filters import FilterSpec
from langchain_ascend.index.retriever import AscendFAISSRetriever
from langchain_ascend.index.search import ScoredDocs
from langchain_ascend.index.store_state import (
    IndexOptions,
    StoreState,
    require_texts,
    split_pairs,
    text_items,
    texts_to_add,
)

if TYPE_CHECKING:
    import torch

    from langchain_ascend.index.device_index import FlatIndex
    from langchain_ascend.index.faiss_io import FaissIndex

__all__ = ["AscendFAISS", "AscendFAISSRetriever", "DistanceStrategy"]

Filter = FilterSpec | None


class AscendFAISS(VectorStore):
    """Vector store with the ``langchain_community`` FAISS API, searched on the device.

    The vectors sit in one device tensor (float32 by default; ``dtype="float16"`` /
    ``"bfloat16"`` to halve memory); exact search is one matmul + top-k per batch of queries.
    Metadata filters become a device mask applied before top-k, so ``k`` results come back
    whenever ``k`` documents match. Ids are unique: adding an existing id replaces it (upsert);
    deleting an unknown id is a no-op. Saving writes safetensors + JSON, never pickle.

    Scores and ``score_threshold`` mean what they mean in lc FAISS (squared L2 for EUCLIDEAN,
    the inner product for MAX_INNER_PRODUCT), except that COSINE is a real cosine: score
    ``1 - cos``, relevance ``cos`` (docs/retrieval.md has the table). Every ``a*`` method awaits
    the query embedding and searches in an executor, so the event loop never waits on the device.

    Args:
        embedding_function: The embedding model (positional, as in lc FAISS).
        index: None (built on first add), one of our indexes, or a faiss index to adopt: a
            flat faiss index is copied to the device; any other stays a faiss index.
        docstore: With ``index``: the documents of its rows (anything with ``search(id)``).
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
        if embedding is not None and embedding_function is not None and (
                embedding is not embedding_function):
            raise VectorStoreInputError("pass either embedding_function or embedding, not both")
        IndexOptions.check_type(index_type)
        self._embedding = embedding if embedding is not None else embedding_function
        self.distance_strategy = as_strategy(distance_strategy)
        self._metric = metric_of_strategy(self.distance_strategy)
        self.override_relevance_score_fn = relevance_score_fn
        self._normalize_L2 = bool(normalize_L2)
        self._normalize_queries = self._normalize_L2 or self._metric == "cosine"
        if self._normalize_L2 and self.distance_strategy != DistanceStrategy.EUCLIDEAN_DISTANCE:
            warnings.warn(f"Normalizing L2 is not applicable for metric type: "
                          f"{self.distance_strategy}", stacklevel=2)
        self._options = IndexOptions.resolve(
            index_type, self._metric, device=device, dtype=dtype, nlist=nlist, nprobe=nprobe,
            faiss_factory=faiss_factory, ivf_min_train_size=ivf_min_train_size)
        self._state = StoreState(self._options.device)
        if index is not None:
            adopt(self._state, self._options, self.distance_strategy, index, docstore,
                  index_to_docstore_id)

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
        return self._state.index

    @property
    def docstore(self) -> DocumentStore:
        """Documents by id (read-only use: ``docstore.search(id)``)."""
        return DocumentStore(self._state.docs, self._state.hand_out)

    @property
    def index_to_docstore_id(self) -> Mapping[int, str]:
        """Read-only row -> id mapping."""
        return RowIdView(lambda: self._state.row_ids)

    @property
    def device(self) -> torch.device:
        """Where the vectors live."""
        return self._options.device

    @property
    def dim(self) -> int | None:
        """Vector dimension (None before the first add)."""
        return self._state.dim

    def __len__(self) -> int:
        return len(self._state.row_ids)

    # ---- writes (validated whole, then applied under the state's lock) ------------------------
    def _add(self, texts: Iterable[str], vectors: Any, metadatas: Any = None,
             ids: Any = None) -> list[str]:
        return self._state.add(texts, vectors, metadatas, ids, normalize=self._normalize_L2,
                               new_index=self._options.new_index)

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Embed and add texts; an id already in the store is replaced. Returns the ids."""
        texts = texts_to_add(texts, metadatas, ids)
        if not texts:
            return []
        return self._add(texts, embedding_calls.documents(self._embedding, texts), metadatas, ids)

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Async :meth:`add_texts` (embedding awaited, the index write in an executor)."""
        texts = texts_to_add(texts, metadatas, ids)
        if not texts:
            return []
        vectors = await embedding_calls.adocuments(self._embedding, texts)
        return await run_in_executor(None, self._add, texts, vectors, metadatas, ids)

    def add_embeddings(self, text_embeddings: Iterable[tuple[str, Any]],
                       metadatas: list[dict] | None = None, ids: list[str] | None = None,
                       **kwargs: Any) -> list[str]:
        """Add ``(text, vector)`` pairs without embedding (vectors may also be numpy rows)."""
        texts, vectors = split_pairs(text_embeddings)
        return self._add(texts, vectors, metadatas, ids)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id; unknown ids are ignored; ``ids=None`` raises
        ``VectorStoreInputError`` (lc FAISS raises ValueError)."""
        if ids is None:
            raise VectorStoreInputError("No ids provided to delete (ids=None); pass the ids, "
                                        "or one id as a string")
        self._state.delete(ids)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked."""
        return self._state.get_by_ids(ids)

    def merge_from(self, target: Any) -> None:
        """Add all documents and vectors of another store (ours or an lc FAISS); ids in both
        or another strategy raise ``VectorStoreInputError``, another dimension
        ``EmbeddingDimensionError``."""
        rows, strategy = ((target._state.export(), target.distance_strategy)
                          if isinstance(target, AscendFAISS) else foreign_rows(target))
        ids, docs, vectors = checked_merge(rows, strategy, self.distance_strategy, self.dim)
        if not ids:
            return
        with self._state.lock:
            self._state.check_new_ids(ids)
            self._add([d.page_content for d in docs], vectors, [d.metadata for d in docs], ids)

    # ---- search (one matmul per batch of queries; raw scores as in the class docstring) -------
    def similarity_search_with_score_by_vectors(self, embeddings: Any, k: int = 4,
                                                filter: Filter = None, fetch_k: int = 20,
                                                **kwargs: Any) -> list[ScoredDocs]:
        """One ``[(Document, score), ...]`` per row of ``embeddings`` (B, D); the filter applies
        before top-k (``fetch_k`` is for lc compatibility); ``score_threshold=``: raw score."""
        return search.search_by_vectors(
            self._state, embeddings, k, filter, normalize=self._normalize_queries,
            metric=self._metric, score_threshold=kwargs.get("score_threshold"))

    def similarity_search_with_score_by_vector(self, embedding: Any, k: int = 4,
                                               filter: Filter = None, fetch_k: int = 20,
                                               **kwargs: Any) -> ScoredDocs:
        """Documents most similar to a vector, with raw scores."""
        return self.similarity_search_with_score_by_vectors(
            search.one_query(embedding), k, filter, fetch_k, **kwargs)[0]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Filter = None,
                                     fetch_k: int = 20, **kwargs: Any) -> ScoredDocs:
        """Documents most similar to a query text, with raw scores."""
        return self.similarity_search_with_score_by_vectors(
            embedding_calls.queries(self._embedding, [query]), k, filter, fetch_k, **kwargs)[0]

    def similarity_search_by_vector(self, embedding: Any, k: int = 4, filter: Filter = None,
                                    fetch_k: int = 20, **kwargs: Any) -> list[Document]:
        """Documents most similar to a vector."""
        return _docs(self.similarity_search_with_score_by_vector(
            embedding, k, filter, fetch_k, **kwargs))

    def similarity_search(self, query: str, k: int = 4, filter: Filter = None,
                          fetch_k: int = 20, **kwargs: Any) -> list[Document]:
        """Documents most similar to a query text."""
        return _docs(self.similarity_search_with_score(query, k, filter, fetch_k, **kwargs))

    def similarity_search_with_score_batch(self, queries: Sequence[str], k: int = 4,
                                           filter: Filter = None, fetch_k: int = 20,
                                           **kwargs: Any) -> list[ScoredDocs]:
        """Several query texts in one search call; raw scores."""
        queries = text_items(queries, "queries")
        if not queries:
            return []
        return self.similarity_search_with_score_by_vectors(
            embedding_calls.queries(self._embedding, queries), k, filter, fetch_k, **kwargs)

    def similarity_search_batch(self, queries: Sequence[str], k: int = 4, filter: Filter = None,
                                fetch_k: int = 20, **kwargs: Any) -> list[list[Document]]:
        """Several query texts in one search call."""
        return [_docs(pairs) for pairs in self.similarity_search_with_score_batch(
            queries, k, filter, fetch_k, **kwargs)]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """The relevance function lc FAISS uses for this distance strategy."""
        if self.override_relevance_score_fn is not None:
            return self.override_relevance_score_fn
        if self._metric == "ip":
            return self._max_inner_product_relevance_score_fn
        if self._metric == "cosine":
            return self._cosine_relevance_score_fn
        return self._euclidean_relevance_score_fn

    def similarity_search_with_relevance_scores_batch(
            self, queries: Sequence[str], k: int = 4, score_threshold: float | None = None,
            **kwargs: Any) -> list[ScoredDocs]:
        """``similarity_search_with_relevance_scores`` for several queries in one search."""
        return search.with_relevance(self.similarity_search_with_score_batch(queries, k, **kwargs),
                                     self._select_relevance_score_fn(), score_threshold)

    def _mmr_by_vectors(self, embeddings: Any, k: int, fetch_k: int, lambda_mult: float,
                        filter: Filter) -> list[ScoredDocs]:
        return search.mmr_by_vectors(self._state, embeddings, k, fetch_k, lambda_mult, filter,
                                     normalize=self._normalize_queries)

    def max_marginal_relevance_search_with_score_by_vector(
            self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None) -> ScoredDocs:
        """MMR over the ``fetch_k`` best matches (filter applied first), with their scores."""
        return self._mmr_by_vectors(search.one_query(embedding), k, fetch_k, lambda_mult,
                                    filter)[0]

    def max_marginal_relevance_search_by_vector(
            self, embedding: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[Document]:
        """Documents selected by maximal marginal relevance for a vector."""
        return _docs(self.max_marginal_relevance_search_with_score_by_vector(
            embedding, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter))

    def max_marginal_relevance_search(
            self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[Document]:
        """Documents selected by maximal marginal relevance for a query text."""
        return _docs(self._mmr_by_vectors(embedding_calls.queries(self._embedding, [query]), k,
                                          fetch_k, lambda_mult, filter)[0])

    def max_marginal_relevance_search_batch(
            self, queries: Sequence[str], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[list[Document]]:
        """MMR for several query texts; the candidate search is one matmul."""
        queries = text_items(queries, "queries")
        if not queries:
            return []
        return [_docs(pairs) for pairs in self._mmr_by_vectors(
            embedding_calls.queries(self._embedding, queries), k, fetch_k, lambda_mult, filter)]

    # ---- async twins: the query embedding awaited, the search in an executor ------------------
    async def asimilarity_search_with_score_by_vector(
            self, embedding: Any, k: int = 4, filter: Filter = None, fetch_k: int = 20,
            **kwargs: Any) -> ScoredDocs:
        return await run_in_executor(None, self.similarity_search_with_score_by_vector,
                                     embedding, k, filter, fetch_k, **kwargs)

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: Filter = None,
                                            fetch_k: int = 20, **kwargs: Any) -> ScoredDocs:
        return (await self.asimilarity_search_with_score_batch(
            [query], k, filter, fetch_k, **kwargs))[0]

    async def asimilarity_search_by_vector(self, embedding: Any, k: int = 4, filter: Filter = None,
                                           fetch_k: int = 20, **kwargs: Any) -> list[Document]:
        return _docs(await self.asimilarity_search_with_score_by_vector(
            embedding, k, filter, fetch_k, **kwargs))

    async def asimilarity_search(self, query: str, k: int = 4, filter: Filter = None,
                                 fetch_k: int = 20, **kwargs: Any) -> list[Document]:
        return _docs(await self.asimilarity_search_with_score(query, k, filter, fetch_k, **kwargs))

    async def asimilarity_search_with_score_batch(
            self, queries: Sequence[str], k: int = 4, filter: Filter = None, fetch_k: int = 20,
            **kwargs: Any) -> list[ScoredDocs]:
        if not (queries := text_items(queries, "queries")):  # the sync methods' check
            return []
        vectors = await embedding_calls.aqueries(self._embedding, queries)
        return await run_in_executor(None, self.similarity_search_with_score_by_vectors,
                                     vectors, k, filter, fetch_k, **kwargs)

    async def asimilarity_search_batch(
            self, queries: Sequence[str], k: int = 4, filter: Filter = None, fetch_k: int = 20,
            **kwargs: Any) -> list[list[Document]]:
        return [_docs(pairs) for pairs in await self.asimilarity_search_with_score_batch(
            queries, k, filter, fetch_k, **kwargs)]

    async def asimilarity_search_with_relevance_scores_batch(
            self, queries: Sequence[str], k: int = 4, score_threshold: float | None = None,
            **kwargs: Any) -> list[ScoredDocs]:
        return search.with_relevance(await self.asimilarity_search_with_score_batch(
            queries, k, **kwargs), self._select_relevance_score_fn(), score_threshold)

    async def amax_marginal_relevance_search_with_score_by_vector(
            self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None) -> ScoredDocs:
        return await run_in_executor(
            None, self.max_marginal_relevance_search_with_score_by_vector, embedding, k=k,
            fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter)

    async def amax_marginal_relevance_search_by_vector(
            self, embedding: Any, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[Document]:
        return _docs(await self.amax_marginal_relevance_search_with_score_by_vector(
            embedding, k=k, fetch_k=fetch_k, lambda_mult=lambda_mult, filter=filter))

    async def amax_marginal_relevance_search(
            self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[Document]:
        return (await self.amax_marginal_relevance_search_batch(
            [query], k, fetch_k, lambda_mult, filter))[0]

    async def amax_marginal_relevance_search_batch(
            self, queries: Sequence[str], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: Filter = None, **kwargs: Any) -> list[list[Document]]:
        if not (queries := text_items(queries, "queries")):
            return []
        vectors = await embedding_calls.aqueries(self._embedding, queries)
        return [_docs(pairs) for pairs in await run_in_executor(
            None, self._mmr_by_vectors, vectors, k, fetch_k, lambda_mult, filter)]

    # ---- persistence: langchain_ascend.index.persist ------------------------------------------
    def save_local(self, folder_path: str | Path, index_name: str = "index") -> None:
        """Save atomically (safetensors + JSON, checksums, no pickle; saves to one folder take
        turns): a crash leaves the last save loadable; unstorable metadata raises first."""
        persist.save(folder_path, index_name, self._state, self._options,
                     distance_strategy=self.distance_strategy.value,
                     normalize_L2=self._normalize_L2)

    @classmethod
    def load_local(cls, folder_path: str | Path, embeddings: Embeddings | None,
                   index_name: str = "index", *, allow_dangerous_deserialization: bool = False,
                   **kwargs: Any) -> AscendFAISS:
        """Load a folder saved by :meth:`save_local`, or by ``langchain_community`` FAISS (a
        pickle: only with ``allow_dangerous_deserialization=True``, as in lc; its distance
        strategy from the faiss metric unless passed). ``**kwargs``: constructor options.

        Raises:
            IndexFormatError: Nothing saved under that name, or damaged files.
            ChecksumMismatchError: A file changed since it was saved.
            UnsafeDeserializationError: An lc folder without the flag.
        """
        return cls._rebuild(persist.load(
            folder_path, index_name, options=kwargs,
            allow_dangerous_deserialization=allow_dangerous_deserialization), embeddings)

    @classmethod
    def _rebuild(cls, loaded: persist.LoadedStore, embeddings: Embeddings | None) -> AscendFAISS:
        store = cls(embeddings, *loaded.args, **loaded.options)
        loaded.fill(store._state, store._options)
        return store

    def serialize_to_bytes(self) -> bytes:
        """The :meth:`save_local` folder as an uncompressed tar in memory (no pickle)."""
        return persist.to_bytes(self.save_local)

    @classmethod
    def deserialize_from_bytes(cls, serialized: bytes, embeddings: Embeddings | None, *,
                               allow_dangerous_deserialization: bool = False,
                               **kwargs: Any) -> AscendFAISS:
        """Inverse of :meth:`serialize_to_bytes`; lc FAISS's pickle bytes only with the flag
        (else ``UnsafeDeserializationError``); anything else is an ``IndexFormatError``."""
        return cls._rebuild(persist.load_bytes(
            serialized, options=kwargs,
            allow_dangerous_deserialization=allow_dangerous_deserialization), embeddings)

    # ---- constructors --------------------------------------------------------------------------
    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings,
                   metadatas: list[dict] | None = None, ids: list[str] | None = None,
                   **kwargs: Any) -> AscendFAISS:
        """Embed texts and build a store (options as in the constructor); no texts raise
        ``VectorStoreInputError`` (start empty with ``AscendFAISS(embedding=...)``)."""
        texts = text_items(texts)
        require_texts(texts)
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings,
                          metadatas: list[dict] | None = None, ids: list[str] | None = None,
                          **kwargs: Any) -> AscendFAISS:
        """Async :meth:`from_texts` (embedding awaited)."""
        texts = text_items(texts)
        require_texts(texts)
        store = cls(embedding, **kwargs)
        await store.aadd_texts(texts, metadatas, ids)
        return store

    @classmethod
    def from_embeddings(cls, text_embeddings: Iterable[tuple[str, Any]], embedding: Embeddings,
                        metadatas: Iterable[dict] | None = None, ids: list[str] | None = None,
                        **kwargs: Any) -> AscendFAISS:
        """Build a store from ``(text, vector)`` pairs."""
        pairs = list(text_embeddings)
        require_texts(pairs)
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

    def as_retriever(self, **kwargs: Any) -> AscendFAISSRetriever:
        """A retriever whose ``batch``/``abatch`` run one batched search for all queries
        (``search_type`` and ``search_kwargs`` as in LangChain)."""
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return AscendFAISSRetriever(vectorstore=self, tags=tags, **kwargs)


def _docs(pairs: ScoredDocs) -> list[Document]:
    return [doc for doc, _ in pairs]
