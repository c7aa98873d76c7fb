"""Searching a :class:`~langchain_ascend.index.store_state.StoreState`: rows, scores, MMR.

One call searches a whole batch of queries (one matmul on the flat index); the filter becomes
a device mask before top-k. Raw scores follow lc FAISS: squared L2 / cosine distance (lower
is better) or inner product (higher is better). ``score_threshold`` bounds the raw score in
:func:`threshold` and the relevance score in :func:`with_relevance`, as in lc FAISS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.documents import Document

from langchain_ascend.index.device_index import l2_normalize, to_matrix
from langchain_ascend.index.filters import FilterSpec, parse_filter
from langchain_ascend.index.mmr import mmr_select
from langchain_ascend.index.store_state import StoreState
from langchain_ascend.validation import STORE, check_count, check_int, check_probability

ScoredDocs = list[tuple[Document, float]]


def one_query(embedding: Any) -> Any:
    """A single query vector as a batch of one (arrays and tensors keep their type)."""
    return embedding.reshape(1, -1) if hasattr(embedding, "reshape") else [embedding]


def search_rows(state: StoreState, queries: Any, k: int, filter: FilterSpec | None, *,
                normalize: bool) -> list[list[tuple[int, float]]]:
    """(row, raw score) lists per query; caller holds the lock.

    Raises:
        InvalidFilterError: A bad filter.
        VectorStoreInputError: A negative ``k``.
    """
    node = None if filter is None else parse_filter(filter)
    k = int(check_int("k", k, minimum=0, errors=STORE))  # numpy ints: faiss takes int only
    matrix = to_matrix(queries, device=state.device, dim=state.dim)
    if state.index is None or state.index.ntotal == 0 or k == 0:
        return [[] for _ in range(matrix.shape[0])]
    if normalize:
        matrix = l2_normalize(matrix)
    result = state.index.search(matrix, k, state.mask(node))
    rows, scores = result.rows.tolist(), result.scores.tolist()
    return [[(r, s) for r, s in zip(row_list, score_list, strict=True) if r >= 0]
            for row_list, score_list in zip(rows, scores, strict=True)]


def threshold(pairs: ScoredDocs, score_threshold: float | None, metric: str) -> ScoredDocs:
    """Pairs whose raw score passes ``score_threshold`` (``>=`` for ip, else ``<=``)."""
    if score_threshold is None:
        return pairs
    if metric == "ip":
        return [(d, s) for d, s in pairs if s >= score_threshold]
    return [(d, s) for d, s in pairs if s <= score_threshold]


def search_by_vectors(state: StoreState, queries: Any, k: int, filter: FilterSpec | None, *,
                      normalize: bool, metric: str,
                      score_threshold: float | None) -> list[ScoredDocs]:
    """``[(Document, raw score), ...]`` per query, thresholded on the raw score."""
    with state.lock:
        hits = search_rows(state, queries, k, filter, normalize=normalize)
        out = [[(state.doc_at(r), float(s)) for r, s in pairs] for pairs in hits]
    return [threshold(pairs, score_threshold, metric) for pairs in out]


def with_relevance(results: list[ScoredDocs], relevance: Callable[[float], float],
                   score_threshold: float | None) -> list[ScoredDocs]:
    """Raw scores turned into relevance scores; those under ``score_threshold`` dropped."""
    out = []
    for pairs in results:
        scored = [(d, relevance(s)) for d, s in pairs]
        if score_threshold is not None:
            scored = [(d, s) for d, s in scored if s >= score_threshold]
        out.append(scored)
    return out


def mmr_by_vectors(state: StoreState, embeddings: Any, k: int, fetch_k: int, lambda_mult: float,
                   filter: FilterSpec | None, *, normalize: bool) -> list[ScoredDocs]:
    """Maximal marginal relevance over each query's ``fetch_k`` best (filtered) rows."""
    import torch

    k = int(check_int("k", k, minimum=0, errors=STORE))
    fetch_k = int(check_count("fetch_k", fetch_k, errors=STORE))
    check_probability("lambda_mult", lambda_mult, errors=STORE)
    with state.lock:
        queries = to_matrix(embeddings, device=state.device, dim=state.dim)
        hits = search_rows(state, queries, fetch_k, filter, normalize=normalize)
        out: list[ScoredDocs] = []
        for q, pairs in zip(queries, hits, strict=True):
            if not pairs or k <= 0:
                out.append([])
                continue
            rows = torch.tensor([r for r, _ in pairs], dtype=torch.int64)
            assert state.index is not None
            chosen = mmr_select(q, state.index.reconstruct(rows), k, lambda_mult)
            out.append([(state.doc_at(pairs[i][0]), float(pairs[i][1])) for i in chosen])
    return out
