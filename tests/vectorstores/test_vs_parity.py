"""Same ids, scores (1e-4) and orderings as langchain_community FAISS for the same vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from vectorstore_test_helpers import TableEmbeddings, lc_module

from langchain_ascend import AscendFAISS

# Same relevance formulas as lc FAISS, so unnormalised vectors give scores outside [0, 1] in
# both stores; LangChain's base class warns about that.
pytestmark = pytest.mark.filterwarnings("ignore:Relevance scores must be between")

FAISS = lc_module("langchain_community.vectorstores").FAISS
LcStrategy = lc_module("langchain_community.vectorstores.utils").DistanceStrategy

TEXTS = [f"doc {i}" for i in range(120)]
METAS = [{"i": i, "group": i % 5, "kind": "even" if i % 2 == 0 else "odd"} for i in range(120)]
QUERIES = [f"query {j}" for j in range(8)]


def build_pair(strategy, normalize: bool = False):
    emb = TableEmbeddings(dim=24, seed=11)
    ids = [f"id-{i}" for i in range(len(TEXTS))]
    lc = FAISS.from_texts(TEXTS, emb, metadatas=METAS, ids=ids, distance_strategy=strategy,
                          normalize_L2=normalize)
    ours = AscendFAISS.from_texts(TEXTS, emb, metadatas=METAS, ids=ids, device="cpu",
                                  distance_strategy=strategy, normalize_L2=normalize)
    return lc, ours


def same(lc_pairs, our_pairs) -> None:
    assert [d.id for d, _ in our_pairs] == [d.id for d, _ in lc_pairs]
    np.testing.assert_allclose([s for _, s in our_pairs], [float(s) for _, s in lc_pairs],
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("strategy, normalize", [
    (LcStrategy.EUCLIDEAN_DISTANCE, False),
    (LcStrategy.EUCLIDEAN_DISTANCE, True),
    (LcStrategy.MAX_INNER_PRODUCT, False),
])
def test_scores_relevance_and_mmr_match_lc_faiss(strategy, normalize) -> None:
    lc, ours = build_pair(strategy, normalize)
    for query in QUERIES:
        same(lc.similarity_search_with_score(query, k=6), ours.similarity_search_with_score(
            query, k=6))
        same(lc.similarity_search_with_relevance_scores(query, k=6),
             ours.similarity_search_with_relevance_scores(query, k=6))
        if not normalize:  # lc's MMR searches with an unnormalised query
            lc_mmr = lc.max_marginal_relevance_search(query, k=5, fetch_k=15, lambda_mult=0.3)
            our_mmr = ours.max_marginal_relevance_search(query, k=5, fetch_k=15, lambda_mult=0.3)
            assert [d.id for d in our_mmr] == [d.id for d in lc_mmr]


def test_squared_euclidean_is_what_both_report() -> None:
    lc, ours = build_pair(LcStrategy.EUCLIDEAN_DISTANCE)
    emb = ours.embeddings
    query = np.array(emb.embed_query("query 0"))
    doc, score = ours.similarity_search_with_score("query 0", k=1)[0]
    vec = np.array(emb.embed_query(doc.page_content))
    assert score == pytest.approx(float(((query - vec) ** 2).sum()), rel=1e-5)


def test_filter_returns_k_where_lc_post_filter_starves() -> None:
    lc, ours = build_pair(LcStrategy.EUCLIDEAN_DISTANCE)
    rare = {"i": {"$in": [3, 50, 77, 101, 119]}}
    lc_hits = lc.similarity_search_with_score("query 1", k=4, filter=rare)  # fetch_k=20
    our_hits = ours.similarity_search_with_score("query 1", k=4, filter=rare)
    assert len(our_hits) == 4 and len(lc_hits) < 4
    wide = lc.similarity_search_with_score("query 1", k=4, filter=rare, fetch_k=120)
    same(wide, our_hits)  # with enough over-fetch lc agrees with us


@pytest.mark.parametrize("spec", [
    {"group": 2},
    {"group": [1, 3]},
    {"i": {"$gte": 30, "$lt": 60}},
    {"$or": [{"kind": "even"}, {"group": 1}]},
    {"$not": {"group": {"$in": [0, 1, 2]}}},
    {"$and": [{"kind": "odd"}, {"i": {"$neq": 7}}]},
])
def test_filtered_results_equal_lc_with_full_fetch(spec) -> None:
    lc, ours = build_pair(LcStrategy.EUCLIDEAN_DISTANCE)
    for query in QUERIES[:3]:
        same(lc.similarity_search_with_score(query, k=5, filter=spec, fetch_k=len(TEXTS)),
             ours.similarity_search_with_score(query, k=5, filter=spec))
    callable_filter = lc.similarity_search("query 2", k=5, fetch_k=120,
                                           filter=lambda m: m["group"] == 4)
    assert [d.id for d in ours.similarity_search(
        "query 2", k=5, filter=lambda m: m["group"] == 4)] == [d.id for d in callable_filter]


def test_cosine_is_real_cosine() -> None:
    lc, ours = build_pair(LcStrategy.COSINE)
    emb = ours.embeddings
    q = np.array(emb.embed_query("query 3"))
    vectors = np.array([emb.embed_query(t) for t in TEXTS])
    cos = vectors @ q / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(q))
    top = np.argsort(-cos)[:5]
    hits = ours.similarity_search_with_relevance_scores("query 3", k=5)
    assert [d.page_content for d, _ in hits] == [TEXTS[i] for i in top]
    np.testing.assert_allclose([s for _, s in hits], cos[top], rtol=1e-5, atol=1e-6)
    raw = ours.similarity_search_with_score("query 3", k=5)
    np.testing.assert_allclose([s for _, s in raw], 1 - cos[top], rtol=1e-5, atol=1e-6)
    lc_relevance = [s for _, s in lc.similarity_search_with_relevance_scores("query 3", k=5)]
    assert not np.allclose(lc_relevance, cos[top])  # lc's COSINE is 1 - squared L2


def test_score_threshold_semantics() -> None:
    lc, ours = build_pair(LcStrategy.EUCLIDEAN_DISTANCE)
    all_scores = [s for _, s in ours.similarity_search_with_score("query 4", k=10)]
    cut = (all_scores[2] + all_scores[3]) / 2
    raw = ours.similarity_search_with_score("query 4", k=10, score_threshold=cut)
    assert len(raw) == 3  # raw distance <= threshold
    same(lc.similarity_search_with_score("query 4", k=10, score_threshold=cut), raw)
    lc_ip, ours_ip = build_pair(LcStrategy.MAX_INNER_PRODUCT)
    ip_scores = [s for _, s in ours_ip.similarity_search_with_score("query 4", k=10)]
    ip_cut = (ip_scores[1] + ip_scores[2]) / 2
    assert len(ours_ip.similarity_search_with_score("query 4", k=10, score_threshold=ip_cut)) == 2
    rel = [s for _, s in ours.similarity_search_with_relevance_scores("query 4", k=10)]
    rel_cut = (rel[4] + rel[5]) / 2  # relevance >= threshold (base VectorStore semantics)
    kept = ours.similarity_search_with_relevance_scores("query 4", k=10, score_threshold=rel_cut)
    assert len(kept) == 5 and all(s >= rel_cut for _, s in kept)
    retriever = ours.as_retriever(search_type="similarity_score_threshold",
                                  search_kwargs={"k": 10, "score_threshold": rel_cut})
    assert [d.id for d in retriever.invoke("query 4")] == [d.id for d, _ in kept]
    assert all(math.isfinite(s) for s in rel)
