"""The async twins of :class:`~langchain_ascend.vectorstores.AscendFAISS`'s search methods.

Each awaits the query embedding (when it has a query text) and runs the sync search in an
executor, so the event loop never waits on the device. The signatures are lc FAISS's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.runnables.config import run_in_executor

from langchain_ascend.index import embedding_calls
from langchain_ascend.index.filters import FilterSpec
from langchain_ascend.index.search import ScoredDocs, with_relevance


class AsyncSearchMixin:
    """Async search methods over the sync ones of the class they are mixed into (first base)."""

    if TYPE_CHECKING:
        _embedding: Any

        def similarity_search_with_score_by_vectors(
            self, embeddings: Any, k: int = 4, filter: FilterSpec | None = None,
            fetch_k: int = 20, **kwargs: Any) -> list[ScoredDocs]: ...

        def similarity_search_with_score_by_vector(
            self, embedding: Any, k: int = 4, filter: FilterSpec | None = None,
            fetch_k: int = 20, **kwargs: Any) -> ScoredDocs: ...

        def max_marginal_relevance_search_with_score_by_vector(
            self, embedding: Any, *, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
            filter: FilterSpec | None = None) -> ScoredDocs: ...

        def _mmr_by_vectors(self, embeddings: Any, k: int, fetch_k: int, lambda_mult: float,
                            filter: FilterSpec | None) -> list[ScoredDocs]: ...

        def _select_relevance_score_fn(self) -> Callable[[float], float]: ...

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
        vectors = await embedding_calls.aqueries(self._embedding, [query])
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
        vectors = await embedding_calls.aqueries(self._embedding, list(queries))
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
        vectors = await embedding_calls.aqueries(self._embedding, [query])
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
        vectors = await embedding_calls.aqueries(self._embedding, list(queries))
        results = await run_in_executor(
            None, lambda: self._mmr_by_vectors(vectors, k, fetch_k, lambda_mult, filter))
        return [[d for d, _ in pairs] for pairs in results]

    async def asimilarity_search_with_relevance_scores_batch(
        self, queries: Sequence[str], k: int = 4, score_threshold: float | None = None,
        **kwargs: Any,
    ) -> list[ScoredDocs]:
        """Async :meth:`similarity_search_with_relevance_scores_batch`."""
        return with_relevance(
            await self.asimilarity_search_with_score_batch(queries, k, **kwargs),
            self._select_relevance_score_fn(), score_threshold)
