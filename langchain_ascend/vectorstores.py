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

import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore

from langchain_ascend.errors import (
    IndexFormatError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)
from langchain_ascend.index import embedding_calls, search
from langchain_ascend.index.async_search import AsyncSearchMixin
from langchain_ascend.index.distance import DistanceStrategy, as_strategy, metric_of_strategy
from langchain_ascend.index.docstore import DocumentStore, RowIdView
from langchain_ascend.index.filters import FilterSpec
from langchain_ascend.index.retriever import AscendFAISSRetriever
from langchain_ascend.index.search import ScoredDocs
from langchain_ascend.index.store_state import (
    INDEX_TYPES,
    IndexOptions,
    StoreState,
    text_items,
    validated_rows,
)
from langchain_ascend.validation import STORE, as_items, check_count, check_device

if TYPE_CHECKING:
    import torch

    from langchain_ascend.index.device_index import FlatIndex
    from langchain_ascend.index.faiss_io import FaissIndex

__all__ = ["AscendFAISS", "AscendFAISSRetriever", "DistanceStrategy"]


class AscendFAISS(AsyncSearchMixin, VectorStore):
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
        if isinstance(device, str):  # the spelling ("cpu:1" is no device); existence below
            check_device(device, errors=STORE)
        self._device = resolve_device(device)
        try:
            self._dtype = resolve_dtype(dtype, self._device)
        except ValueError as exc:
            raise VectorStoreInputError(str(exc)) from None
        for name, value in (("nlist", nlist), ("nprobe", nprobe),
                            ("ivf_min_train_size", ivf_min_train_size)):
            check_count(name, value, allow_none=True, errors=STORE)
        self._options = IndexOptions(index_type, self._metric, self._device, self._dtype, nlist,
                                     nprobe, faiss_factory, ivf_min_train_size)
        self._state = StoreState(self._device)
        if index is not None:
            from langchain_ascend.index.store_io import adopt

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
        return DocumentStore(self._state.docs)

    @property
    def index_to_docstore_id(self) -> Mapping[int, str]:
        """Read-only row -> id mapping."""
        return RowIdView(lambda: self._state.row_ids)

    @property
    def device(self) -> torch.device:
        """Where the vectors live."""
        return self._device

    @property
    def dim(self) -> int | None:
        """Vector dimension (None before the first add)."""
        return self._state.dim

    def __len__(self) -> int:
        return len(self._state.row_ids)

    # ---- writes -------------------------------------------------------------------------------
    def _add(self, texts: Iterable[str], vectors: Any, metadatas: Any = None,
             ids: Any = None) -> list[str]:
        """Validate everything, then write vectors, rows and documents (upsert by id)."""
        from langchain_ascend.index.device_index import l2_normalize, to_matrix

        texts = text_items(texts)
        final_ids, metas = validated_rows(texts, metadatas, ids)
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
        self._state.upsert(final_ids, docs, matrix, self._options.new_index)
        return final_ids

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Embed and add texts; an id already in the store is replaced.

        Returns:
            The ids of the added texts.
        """
        texts = text_items(texts)
        if not texts:
            validated_rows(texts, metadatas, ids)
            return []
        return self._add(texts, embedding_calls.documents(self._embedding, texts), metadatas, ids)

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Async :meth:`add_texts` (embedding awaited, the index write in an executor)."""
        texts = text_items(texts)
        if not texts:
            validated_rows(texts, metadatas, ids)
            return []
        vectors = await embedding_calls.adocuments(self._embedding, texts)
        return await run_in_executor(None, self._add, texts, vectors, metadatas, ids)

    def add_embeddings(self, text_embeddings: Iterable[tuple[str, Any]],
                       metadatas: list[dict] | None = None, ids: list[str] | None = None,
                       **kwargs: Any) -> list[str]:
        """Add ``(text, vector)`` pairs without embedding (vectors may also be numpy rows)."""
        pairs = as_items("text_embeddings", text_embeddings, str_is_item=False,
                         error=VectorStoreArgumentTypeError, what="a list of (text, vector)")
        assert pairs is not None
        return self._add([text for text, _ in pairs], [vec for _, vec in pairs], metadatas, ids)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id; unknown ids are ignored.

        Raises:
            VectorStoreInputError: ``ids`` is None (as lc FAISS, which raises ValueError).
        """
        if ids is None:
            raise VectorStoreInputError("No ids provided to delete (ids=None); pass the ids, "
                                        "or one id as a string")
        self._state.delete(ids)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked."""
        return self._state.get_by_ids(ids)

    # ---- search core --------------------------------------------------------------------------
    @property
    def _normalize_queries(self) -> bool:
        return self._normalize_L2 or self._metric == "cosine"

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
        return search.search_by_vectors(
            self._state, embeddings, k, filter, normalize=self._normalize_queries,
            metric=self._metric, score_threshold=kwargs.get("score_threshold"))

    def similarity_search_with_score_by_vector(
        self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
        fetch_k: int = 20, **kwargs: Any,
    ) -> ScoredDocs:
        """Documents most similar to a vector, with raw scores (see the class docstring)."""
        return self.similarity_search_with_score_by_vectors(search.one_query(embedding), k,
                                                            filter, fetch_k, **kwargs)[0]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: FilterSpec | None = None, fetch_k: int = 20,
        **kwargs: Any,
    ) -> ScoredDocs:
        """Documents most similar to a query text, with raw scores."""
        return self.similarity_search_with_score_by_vectors(
            embedding_calls.queries(self._embedding, [query]), k, filter, fetch_k, **kwargs)[0]

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
        queries = text_items(queries, "queries")
        if not queries:
            return []
        return self.similarity_search_with_score_by_vectors(
            embedding_calls.queries(self._embedding, queries), k, filter, fetch_k, **kwargs)

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
        return search.with_relevance(self.similarity_search_with_score_batch(queries, k, **kwargs),
                                     self._select_relevance_score_fn(), score_threshold)

    # ---- MMR -----------------------------------------------------------------------------------
    def _mmr_by_vectors(self, embeddings: Any, k: int, fetch_k: int, lambda_mult: float,
                        filter: FilterSpec | None) -> list[ScoredDocs]:
        return search.mmr_by_vectors(self._state, embeddings, k, fetch_k, lambda_mult, filter,
                                     normalize=self._normalize_queries)

    def max_marginal_relevance_search_with_score_by_vector(
        self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None,
    ) -> ScoredDocs:
        """MMR over the ``fetch_k`` best matches (filter applied first), with their scores."""
        return self._mmr_by_vectors(search.one_query(embedding), k, fetch_k, lambda_mult,
                                    filter)[0]

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
            embedding_calls.queries(self._embedding, [query]), k, fetch_k, lambda_mult, filter)[0]]

    def max_marginal_relevance_search_batch(
        self, queries: Sequence[str], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
        filter: FilterSpec | None = None, **kwargs: Any,
    ) -> list[list[Document]]:
        """MMR for several query texts; the candidate search is one matmul."""
        queries = text_items(queries, "queries")
        if not queries:
            return []
        return [[d for d, _ in pairs] for pairs in self._mmr_by_vectors(
            embedding_calls.queries(self._embedding, queries), k, fetch_k, lambda_mult, filter)]

    # ---- merge ---------------------------------------------------------------------------------
    def merge_from(self, target: Any) -> None:
        """Add all documents and vectors of another store (ours or an lc FAISS).

        Raises:
            VectorStoreInputError: Ids present in both stores, or different strategies.
            EmbeddingDimensionError: Different vector dimensions.
        """
        from langchain_ascend.index.store_io import merge_input

        ids, docs, vectors = merge_input(target, self.distance_strategy, self.dim)
        if not ids:
            return
        with self._state.lock:
            clash = sorted(set(ids) & set(self._state.id_to_row))
            if clash:
                raise VectorStoreInputError(f"ids present in both stores: {clash[:10]}")
            self._add([d.page_content for d in docs], vectors, [d.metadata for d in docs], ids)

    # ---- persistence ---------------------------------------------------------------------------
    def save_local(self, folder_path: str | Path, index_name: str = "index") -> None:
        """Save to ``folder_path`` atomically (safetensors + JSON with checksums; no pickle).

        A crash during the save leaves the previous save loadable. See
        :mod:`langchain_ascend.index.persistence` for the layout.

        Raises:
            VectorStoreInputError: A metadata value cannot be stored (nothing is written).
        """
        from langchain_ascend.index.persistence import save_folder
        from langchain_ascend.index.store_io import snapshot

        state = self._state
        with state.lock:
            saved = snapshot(state.index, state.documents(), self._options.saved_config(
                state.index, distance_strategy=self.distance_strategy.value,
                normalize_L2=self._normalize_L2, num_vectors=len(state.row_ids)))
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
        from langchain_ascend.index.persistence import has_saved_index, load_folder
        from langchain_ascend.index.store_io import read_lc_folder

        folder = Path(folder_path)
        if has_saved_index(folder, index_name):
            return cls._from_saved(load_folder(folder, index_name), embeddings, **kwargs)
        lc_parts = read_lc_folder(folder, index_name, allow_dangerous_deserialization, kwargs)
        if lc_parts is not None:
            return cls(embeddings, *lc_parts, **kwargs)
        raise IndexFormatError(f"no saved index named {index_name!r} in {folder}")

    @classmethod
    def _from_saved(cls, saved: Any, embeddings: Embeddings | None,
                    **kwargs: Any) -> AscendFAISS:
        from langchain_ascend.index.store_io import options_from_config, restore_state

        options, count, dim = options_from_config(saved.config, kwargs)
        store = cls(embeddings, **options)
        restore_state(saved, store._state, store._options, factory=options["faiss_factory"],
                      count=count, dim=dim)
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
        from langchain_ascend.index.store_io import extract_tar, read_lc_pickle

        if not serialized.startswith(b"\x80"):
            with tempfile.TemporaryDirectory() as tmp:
                extract_tar(serialized, Path(tmp))
                return cls.load_local(tmp, embeddings, **kwargs)
        index, docstore, mapping = read_lc_pickle(serialized, allow_dangerous_deserialization)
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
        texts = text_items(texts)
        _require_texts(texts)
        store = cls(embedding, **kwargs)
        store._add(texts, embedding_calls.documents(store._embedding, texts), metadatas, ids)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings,
                          metadatas: list[dict] | None = None, ids: list[str] | None = None,
                          **kwargs: Any) -> AscendFAISS:
        """Async :meth:`from_texts` (embedding awaited)."""
        texts = text_items(texts)
        _require_texts(texts)
        store = cls(embedding, **kwargs)
        vectors = await embedding_calls.adocuments(store._embedding, texts)
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
