"""AscendFAISS behaviour: upsert, delete, bad input, batch search, retriever, merge, async."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from vectorstore_test_helpers import TableEmbeddings, lc_module

from langchain_ascend import AscendFAISS
from langchain_ascend.errors import (
    EmbeddingDimensionError,
    InvalidFilterError,
    InvalidVectorError,
    LangChainAscendError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)
from langchain_ascend.index.device_index import FlatIndex

pytestmark = pytest.mark.filterwarnings("ignore:Relevance scores must be between")


@pytest.fixture
def emb() -> TableEmbeddings:
    return TableEmbeddings(dim=12, seed=3)


@pytest.fixture
def store(emb) -> AscendFAISS:
    texts = [f"t{i}" for i in range(30)]
    metas = [{"i": i, "even": i % 2 == 0} for i in range(30)]
    return AscendFAISS.from_texts(texts, emb, metadatas=metas, ids=[f"id{i}" for i in range(30)],
                                  device="cpu")


def test_upsert_replaces_document_and_vector(store, emb) -> None:
    store.add_texts(["brand new"], metadatas=[{"i": 99}], ids=["id5"])
    assert len(store) == 30 and store.index.ntotal == 30
    doc, score = store.similarity_search_with_score("brand new", k=1)[0]
    assert (doc.id, doc.page_content, doc.metadata) == ("id5", "brand new", {"i": 99})
    assert score == pytest.approx(0.0, abs=1e-5)
    assert store.similarity_search("t1", k=1, filter={"i": 99})[0].id == "id5"  # filter columns
    assert store.get_by_ids(["id5", "nope", "id0"])[0].page_content == "brand new"


def test_delete_is_idempotent_and_keeps_rows_aligned(store) -> None:
    assert store.delete(["id3", "id4", "missing"]) is True
    assert store.delete(["id3"]) is True
    assert len(store) == 28 and store.index.ntotal == 28
    assert store.get_by_ids(["id3", "id4"]) == []
    for i in (0, 10, 29):  # every remaining row still maps to its own vector
        assert store.similarity_search(f"t{i}", k=1)[0].id == f"id{i}"
    mapping = store.index_to_docstore_id
    assert len(mapping) == 28 and mapping[3] == "id5"
    assert store.docstore.search("id5").page_content == "t5"
    assert store.docstore.search("id3") == "ID id3 not found."
    with pytest.raises(VectorStoreInputError, match="No ids"):
        store.delete(None)


def test_bad_input_raises_typed_errors_and_store_stays_usable(store) -> None:
    before = store.similarity_search_with_score("t7", k=3)
    cases = [
        (EmbeddingDimensionError, lambda: store.add_embeddings([("x", [0.0] * 5)])),
        (InvalidVectorError, lambda: store.add_embeddings([("x", [float("nan")] * 12)])),
        (InvalidVectorError, lambda: store.add_embeddings([("x", [1.0] * 12), ("y", [1.0])])),
        (VectorStoreInputError, lambda: store.add_texts(["a", "b"], metadatas=[{}])),
        (VectorStoreInputError, lambda: store.add_texts(["a", "b"], ids=["same", "same"])),
        (VectorStoreInputError, lambda: store.add_texts(["a"], ids=["1", "2"])),
        (VectorStoreInputError, lambda: store.add_texts(["a"], metadatas=["not a dict"])),
        (InvalidFilterError, lambda: store.similarity_search("t1", filter={"i": {"$like": 1}})),
        (EmbeddingDimensionError, lambda: store.similarity_search_by_vector([0.0] * 3)),
        (VectorStoreInputError, lambda: AscendFAISS.from_texts([], DeterministicFakeEmbedding(
            size=4))),
        (VectorStoreInputError, lambda: AscendFAISS(embedding=None, index_type="hnsw")),
        (VectorStoreInputError, lambda: AscendFAISS(distance_strategy="JACCARD")),
        (VectorStoreInputError, lambda: AscendFAISS(distance_strategy="MANHATTAN")),
        (VectorStoreInputError, lambda: AscendFAISS().similarity_search("x")),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
        assert issubclass(error, (LangChainAscendError, ValueError))
    assert store.similarity_search_with_score("t7", k=3) == before
    assert len(store) == 30 and store.add_texts([]) == []


def test_empty_store_and_empty_filter_results() -> None:
    store = AscendFAISS(embedding=DeterministicFakeEmbedding(size=8), device="cpu")
    assert store.similarity_search("x") == [] and store.index is None
    assert store.max_marginal_relevance_search("x") == []
    store.add_texts(["a", "b"], metadatas=[{"k": 1}, {"k": 2}])
    assert store.similarity_search("a", k=5, filter={"k": 3}) == []
    assert len(store.similarity_search("a", k=5)) == 2


def test_batch_search_is_one_index_call(store, monkeypatch) -> None:
    calls = []
    original = FlatIndex.search

    def counting(self, queries, k, mask=None):
        calls.append(queries.shape[0])
        return original(self, queries, k, mask)

    monkeypatch.setattr(FlatIndex, "search", counting)
    queries = ["t1", "t2", "t3", "t4"]
    batched = store.similarity_search_with_score_batch(queries, k=3, filter={"even": True})
    assert calls == [4]
    singles = [store.similarity_search_with_score(q, k=3, filter={"even": True}) for q in queries]
    assert batched == singles
    vectors = np.array([store.embeddings.embed_query(q) for q in queries], dtype=np.float32)
    by_vectors = store.similarity_search_with_score_by_vectors(torch.from_numpy(vectors), k=3,
                                                               filter={"even": True})
    assert [[d.id for d, _ in r] for r in by_vectors] == [[d.id for d, _ in r] for r in batched]


class CountingHandler(BaseCallbackHandler):
    def __init__(self) -> None:
        self.ends = 0

    def on_retriever_end(self, documents, **kwargs) -> None:  # noqa: ANN001
        self.ends += 1


@pytest.mark.parametrize("search_type, kwargs", [
    ("similarity", {"k": 2}),
    ("mmr", {"k": 2, "fetch_k": 6}),
    ("similarity_score_threshold", {"k": 3, "score_threshold": -1e9}),
])
def test_retriever_batch_uses_one_search(store, monkeypatch, search_type, kwargs) -> None:
    retriever = store.as_retriever(search_type=search_type, search_kwargs=kwargs)
    queries = ["t1", "t8", "t9"]
    expected = [retriever.invoke(q) for q in queries]
    calls = []
    original = FlatIndex.search
    monkeypatch.setattr(FlatIndex, "search", lambda self, q, k, mask=None: (
        calls.append(q.shape[0]), original(self, q, k, mask))[1])
    handler = CountingHandler()
    assert retriever.batch(queries, config={"callbacks": [handler]}) == expected
    assert calls == [3] and handler.ends == 3
    calls.clear()
    assert asyncio.run(retriever.abatch(queries)) == expected
    assert calls == [3]


def test_retriever_batch_reports_per_query_errors(store) -> None:
    retriever = store.as_retriever(search_kwargs={"filter": {"i": {"$bad": 1}}})
    results = retriever.batch(["t1", "t2"], return_exceptions=True)
    assert all(isinstance(r, InvalidFilterError) for r in results)


def test_merge_from_ours_and_lc(emb) -> None:
    a = AscendFAISS.from_texts(["a1", "a2"], emb, ids=["a1", "a2"], device="cpu")
    b = AscendFAISS.from_texts(["b1"], emb, ids=["b1"], device="cpu")
    a.merge_from(b)
    assert a.similarity_search("b1", k=1)[0].id == "b1" and len(a) == 3
    lc = lc_module("langchain_community.vectorstores").FAISS.from_texts(["c1"], emb, ids=["c1"])
    a.merge_from(lc)
    assert a.similarity_search("c1", k=1)[0].id == "c1" and len(a) == 4
    with pytest.raises(VectorStoreInputError, match="both stores"):
        a.merge_from(b)
    other = AscendFAISS.from_texts(["z"], TableEmbeddings(dim=5), ids=["z"], device="cpu")
    with pytest.raises(EmbeddingDimensionError):
        a.merge_from(other)
    assert len(a) == 4


def test_lc_style_construction_and_tensor_embeddings(emb) -> None:
    faiss = lc_module("faiss")
    docstore = lc_module("langchain_community.docstore.in_memory").InMemoryDocstore(
        {"x": Document(page_content="t1", id="x"), "y": Document(page_content="t2", id="y")})
    index = faiss.IndexFlatL2(12)
    index.add(np.array([emb.vector("t1"), emb.vector("t2")], dtype=np.float32))
    store = AscendFAISS(emb, index, docstore, {0: "x", 1: "y"}, device="cpu")
    assert store.similarity_search("t2", k=1)[0].id == "y"

    class TensorEmbeddings(TableEmbeddings):
        def embed_documents_tensor(self, texts):  # noqa: ANN001, ANN202
            return torch.tensor(super().embed_documents(texts))

    tensor_emb = TensorEmbeddings(dim=12)
    tensor_store = AscendFAISS(embedding=tensor_emb, device="cpu")
    tensor_store.add_texts(["p", "q"])
    assert tensor_emb.document_calls == 1  # through the tensor method only
    assert tensor_store.similarity_search("q", k=1)[0].page_content == "q"


def test_async_surface(emb) -> None:
    async def run() -> None:
        store = await AscendFAISS.afrom_texts(["a", "b", "c"], emb, ids=["1", "2", "3"],
                                              device="cpu")
        await store.aadd_texts(["d"], ids=["4"])
        assert (await store.asimilarity_search("d", k=1))[0].id == "4"
        assert (await store.asimilarity_search_with_score("a", k=1))[0][0].id == "1"
        assert len(await store.amax_marginal_relevance_search("b", k=2, fetch_k=4)) == 2
        assert [len(r) for r in await store.asimilarity_search_batch(["a", "b"], k=2)] == [2, 2]
        assert await store.adelete(["4"]) and await store.aget_by_ids(["4"]) == []

    asyncio.run(run())


def test_concurrent_writes_and_reads_stay_consistent(emb) -> None:
    store = AscendFAISS(embedding=emb, device="cpu")
    errors = []

    def writer(start: int) -> None:
        try:
            for i in range(start, start + 40):
                store.add_texts([f"w{i}"], metadatas=[{"i": i}], ids=[f"w{i}"])
                if i % 3 == 0:
                    store.delete([f"w{i}"])
                store.similarity_search(f"w{start}", k=3, filter={"i": {"$gte": start}})
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in (0, 100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    deleted = sum(1 for s in (0, 100, 200) for i in range(s, s + 40) if i % 3 == 0)
    assert len(store) == store.index.ntotal == 120 - deleted
    for doc_id in ("w1", "w101", "w202"):
        assert store.similarity_search(doc_id, k=1)[0].id == doc_id


def test_ivf_store_trains_and_answers(emb) -> None:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(8, 12)) * 5
    vectors = (centers[rng.integers(0, 8, 800)] + rng.normal(size=(800, 12))).astype(np.float32)
    pairs = [(f"v{i}", vectors[i]) for i in range(800)]
    store = AscendFAISS.from_embeddings(pairs, emb, device="cpu", index_type="ivf", nlist=8,
                                        nprobe=8, ivf_min_train_size=100)
    exact = AscendFAISS.from_embeddings(pairs, emb, device="cpu")
    got = store.similarity_search_with_score_by_vector(vectors[5] + 0.01, k=5)
    assert store.index.is_trained and store.index.nprobe == 8
    want = exact.similarity_search_with_score_by_vector(vectors[5] + 0.01, k=5)
    assert [(d.page_content, s) for d, s in got] == [(d.page_content, s) for d, s in want]


def test_failed_faiss_training_leaves_store_usable(emb) -> None:
    store = AscendFAISS(embedding=emb, device="cpu", index_type="faiss",
                        faiss_factory="IVF16,Flat", nprobe=16)
    with pytest.raises(VectorStoreInputError, match="training faiss index"):
        store.add_texts([f"few {i}" for i in range(5)])
    assert len(store) == 0 and store.similarity_search("few 1") == []
    store.add_texts([f"many {i}" for i in range(400)], ids=[f"m{i}" for i in range(400)])
    assert store.similarity_search("many 7", k=1)[0].id == "m7"
    store.add_texts(["replaced"], ids=["m7"])  # faiss upsert = remove + add
    assert len(store) == 400 and store.get_by_ids(["m7"])[0].page_content == "replaced"
    assert store.similarity_search("replaced", k=1)[0].id == "m7"


@pytest.mark.parametrize("adopted", [False, True])
def test_upsert_on_an_index_that_cannot_delete_changes_nothing(tmp_path, emb, adopted) -> None:
    """Replacing an id on HNSW (ours, or an lc FAISS HNSW index taken over) needs a delete
    HNSW cannot do: the write is refused before its new vectors are added."""
    if adopted:
        faiss = lc_module("faiss")
        index = faiss.IndexHNSWFlat(12, 16)
        index.add(np.array([emb.vector("t0"), emb.vector("t1")], dtype=np.float32))
        docstore = lc_module("langchain_community.docstore.in_memory").InMemoryDocstore(
            {"1": Document(page_content="t0", id="1"), "2": Document(page_content="t1", id="2")})
        store = AscendFAISS(emb, index, docstore, {0: "1", 1: "2"}, device="cpu")
    else:
        store = AscendFAISS.from_texts(["t0", "t1"], emb, ids=["1", "2"], device="cpu",
                                       index_type="faiss", faiss_factory="HNSW16")
    before = store.similarity_search_with_score("t0", k=3)
    with pytest.raises(VectorStoreInputError, match=r"cannot delete vectors.*\['1'\]"):
        store.add_texts(["new", "t0 again"], ids=["3", "1"])
    assert len(store) == store.index.ntotal == 2
    assert list(store.index_to_docstore_id.values()) == ["1", "2"]
    assert [d.page_content for d in store.get_by_ids(["1", "3"])] == ["t0"]
    assert store.similarity_search_with_score("t0", k=3) == before
    store.save_local(tmp_path)
    assert len(AscendFAISS.load_local(tmp_path, emb)) == 2
    assert store.add_texts(["fresh"], ids=["3"]) == ["3"] and len(store) == 3
    with pytest.raises(VectorStoreInputError, match="cannot delete vectors"):
        store.delete(["1"])
    assert len(store) == store.index.ntotal == 3


@pytest.mark.parametrize("options", [
    {"faiss_factory": "IVF16,Flat", "nprobe": 2},
    {"faiss_factory": "IVF16,Flat", "nprobe": 1, "distance_strategy": "MAX_INNER_PRODUCT"},
    {"faiss_factory": "IVF16,Flat", "nprobe": 1, "distance_strategy": "COSINE"},
    {"faiss_factory": "HNSW16"},
])
def test_faiss_filter_gives_k_whenever_k_documents_match(emb, options) -> None:
    """A selective filter on an approximate faiss index (the match outside the probed IVF
    lists, or off HNSW's graph walk) backs off to an exact scan of the matching rows, as the
    device IVF does: k results whenever k documents match, scored as an exact store scores."""
    vectors = np.random.default_rng(0).standard_normal((3000, 12)).astype(np.float32)
    pairs = [(f"t{i}", vectors[i]) for i in range(3000)]
    metas = [{"g": 99 if i in (5, 6) else i % 10} for i in range(3000)]
    strategy = options.get("distance_strategy", "EUCLIDEAN_DISTANCE")
    store = AscendFAISS.from_embeddings(pairs, emb, metas, device="cpu", index_type="faiss",
                                        **options)
    exact = AscendFAISS.from_embeddings(pairs, emb, metas, device="cpu",
                                        distance_strategy=strategy)
    for filter in ({"g": 99}, {"g": {"$in": [99, 1]}}):
        for q in range(100, 140):
            got = store.similarity_search_with_score_by_vector(vectors[q], k=5, filter=filter)
            want = exact.similarity_search_with_score_by_vector(vectors[q], k=5, filter=filter)
            assert len(got) == len(want) == (2 if filter == {"g": 99} else 5)
            if filter == {"g": 99}:  # every match found: the exact answer
                assert [d.page_content for d, _ in got] == [d.page_content for d, _ in want]
                np.testing.assert_allclose([s for _, s in got], [s for _, s in want],
                                           rtol=1e-4, atol=1e-4)
    found = store.max_marginal_relevance_search_by_vector(vectors[7], k=2, fetch_k=4,
                                                          filter={"g": 99})
    assert sorted(d.page_content for d in found) == ["t5", "t6"]


def test_async_batches_check_queries_as_the_sync_ones_do(store) -> None:
    """A bare string is not a list of one-letter queries, nor an int a query, in async too."""
    batches = ["similarity_search_batch", "max_marginal_relevance_search_batch",
               "similarity_search_with_relevance_scores_batch"]
    for name in batches:
        for bad, words in (("abc", "got the str 'abc'"), ([1, None], r"queries\[0\]")):
            with pytest.raises(VectorStoreArgumentTypeError, match=words):
                getattr(store, name)(bad, k=1)
            with pytest.raises(VectorStoreArgumentTypeError, match=words):
                asyncio.run(getattr(store, "a" + name)(bad, k=1))
        assert asyncio.run(getattr(store, "a" + name)(["t1"], k=1))[0][0] is not None


@pytest.mark.parametrize("factory", ["Flat", "HNSW16"])
def test_numpy_integer_k_and_fetch_k_on_a_faiss_store(emb, factory) -> None:
    store = AscendFAISS.from_texts([f"t{i}" for i in range(10)], emb, device="cpu",
                                   index_type="faiss", faiss_factory=factory)
    assert [d.page_content for d in store.similarity_search("t3", k=np.int64(2))][0] == "t3"
    assert len(store.similarity_search("t3", k=np.int32(3), filter={})) == 3
    assert len(store.max_marginal_relevance_search("t3", k=np.int64(2),
                                                   fetch_k=np.int64(5))) == 2


def test_dict_filters_see_metadata_changed_on_a_returned_document(store) -> None:
    """Documents come back as the stored objects (as in lc FAISS); a caller changing one's
    metadata changes what dict filters match, as it does for callable filters."""
    assert store.similarity_search("t1", k=3, filter={"i": 4})[0].id == "id4"  # columns built
    doc = store.similarity_search("t5", k=1)[0]
    assert doc is store.get_by_ids(["id5"])[0]
    doc.metadata["i"] = 1000
    def ids(spec) -> list[str]:  # noqa: ANN001
        return [d.id for d in store.similarity_search("t5", k=3, filter=spec)]
    assert ids({"i": 1000}) == ids(lambda m: m["i"] == 1000) == ["id5"]
    assert ids({"i": 5}) == ids(lambda m: m["i"] == 5) == []
    assert "id5" in ids({"i": {"$gt": 500}})
    by_store = store.docstore.search("id7")  # the docstore view hands out stored objects too
    by_store.metadata = {"i": 1000, "even": False}
    assert sorted(ids({"i": 1000})) == ["id5", "id7"]
    store.add_texts(["t5"], metadatas=[{"i": 5}], ids=["id5"])  # a replaced doc is fresh again
    assert ids({"i": 5}) == ["id5"] and ids({"i": 1000}) == ["id7"]


def test_the_handed_out_check_stays_bounded(store) -> None:
    """Reading many documents does not make every later filtered search check them all:
    the last HANDED_OUT_LIMIT handed out are checked (the most recent ones)."""
    from langchain_ascend.index.store_state import RecentIds

    recent = RecentIds(limit=3)
    recent.update(["a", "b", "c", "d"])
    recent.add("b")
    assert list(recent) == ["c", "d", "b"] and len(recent) == 3
    recent.difference_update(["c", "x"])
    assert list(recent) == ["d", "b"]
    state = store._state
    state.handed_out.limit = 4
    store.get_by_ids([f"id{i}" for i in range(10)])
    assert len(state.handed_out) == 4
    doc = store.get_by_ids(["id9"])[0]
    doc.metadata["i"] = 2000
    assert [d.id for d in store.similarity_search("t9", k=2, filter={"i": 2000})] == ["id9"]
