"""The retriever of :class:`~langchain_ascend.vectorstores.AscendFAISS`: batched retrieval.

``batch`` / ``abatch`` run one batched search for all queries and hand each per-query run its
precomputed result through a context variable, so callbacks, tags and ``return_exceptions``
behave exactly as in ``VectorStoreRetriever``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from typing import Any, Protocol, cast

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.runnables import RunnableConfig
from langchain_core.vectorstores import VectorStoreRetriever

logger = logging.getLogger(__name__)


class BatchSearchStore(Protocol):
    """The batched searches the retriever needs (``AscendFAISS`` has them); a store without
    them fails the batched search, and each query then runs on its own."""

    def similarity_search_batch(self, queries: list[str], **kwargs: Any
                                ) -> list[list[Document]]: ...

    def similarity_search_with_relevance_scores_batch(
        self, queries: list[str], **kwargs: Any) -> list[list[tuple[Document, float]]]: ...

    def max_marginal_relevance_search_batch(self, queries: list[str], **kwargs: Any
                                            ) -> list[list[Document]]: ...

    async def asimilarity_search_batch(self, queries: list[str], **kwargs: Any
                                       ) -> list[list[Document]]: ...

    async def asimilarity_search_with_relevance_scores_batch(
        self, queries: list[str], **kwargs: Any) -> list[list[tuple[Document, float]]]: ...

    async def amax_marginal_relevance_search_batch(self, queries: list[str], **kwargs: Any
                                                   ) -> list[list[Document]]: ...


def _store(retriever: VectorStoreRetriever) -> BatchSearchStore:
    return cast(BatchSearchStore, retriever.vectorstore)


_PRECOMPUTED: contextvars.ContextVar[dict[str, list[Document]] | None] = contextvars.ContextVar(
    "langchain_ascend_precomputed_retrievals", default=None)


class AscendFAISSRetriever(VectorStoreRetriever):
    """``VectorStoreRetriever`` whose ``batch``/``abatch`` search all queries in one call.

    Callbacks, tags and ``return_exceptions`` behave as in the base class: the results of
    the one batched search are handed to the per-query runs. If the batched search fails,
    each query runs on its own and reports its own error.
    """

    def _search_all(self, queries: list[str]) -> list[list[Document]]:
        store = _store(self)
        kwargs = dict(self.search_kwargs)
        if self.search_type == "similarity":
            return store.similarity_search_batch(queries, **kwargs)
        if self.search_type == "similarity_score_threshold":
            return [[d for d, _ in pairs] for pairs in
                    store.similarity_search_with_relevance_scores_batch(queries, **kwargs)]
        return store.max_marginal_relevance_search_batch(queries, **kwargs)

    async def _asearch_all(self, queries: list[str]) -> list[list[Document]]:
        store = _store(self)
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
