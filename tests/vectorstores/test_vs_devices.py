"""The store on a real accelerator gives the CPU store's results (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest
from vectorstore_test_helpers import TableEmbeddings

from langchain_ascend import AscendFAISS
from langchain_ascend.testing import accelerator_params

DEVICES = accelerator_params()


def pairs(count: int = 600, dim: int = 32) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, dim)) * 4
    vectors = (centers[rng.integers(0, 12, count)] + rng.normal(size=(count, dim)))
    return [(f"v{i}", vectors[i].astype(np.float32)) for i in range(count)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [
    {},
    {"distance_strategy": "COSINE"},
    {"distance_strategy": "MAX_INNER_PRODUCT"},
    {"index_type": "ivf", "nlist": 12, "nprobe": 12, "ivf_min_train_size": 100},
])
def test_device_store_matches_cpu_store(device, options, tmp_path) -> None:
    data = pairs()
    metas = [{"i": i, "g": i % 7} for i in range(len(data))]
    ids = [f"id{i}" for i in range(len(data))]
    emb = TableEmbeddings(dim=32)
    cpu = AscendFAISS.from_embeddings(data, emb, metas, ids, device="cpu", **options)
    dev = AscendFAISS.from_embeddings(data, emb, metas, ids, device=device, **options)
    assert dev.device.type == device
    queries = np.stack([v for _, v in data[:5]]) + 0.05
    for q in queries:
        for flt in (None, {"g": {"$in": [2, 5]}}):
            want = cpu.similarity_search_with_score_by_vector(q, k=6, filter=flt)
            got = dev.similarity_search_with_score_by_vector(q, k=6, filter=flt)
            assert [d.id for d, _ in got] == [d.id for d, _ in want]
            np.testing.assert_allclose([s for _, s in got], [s for _, s in want],
                                       rtol=1e-4, atol=1e-3)
        assert [d.id for d in dev.max_marginal_relevance_search_by_vector(q, k=4)] == [
            d.id for d in cpu.max_marginal_relevance_search_by_vector(q, k=4)]
    batched = dev.similarity_search_with_score_by_vectors(queries, k=3)
    assert [[d.id for d, _ in r] for r in batched] == [
        [d.id for d, _ in r] for r in cpu.similarity_search_with_score_by_vectors(queries, k=3)]
    dev.delete(["id1", "id2"])
    dev.save_local(tmp_path)
    loaded = AscendFAISS.load_local(tmp_path, emb, device=device)
    assert len(loaded) == len(data) - 2
    assert loaded.similarity_search_by_vector(queries[3], k=1)[0].id == "id3"


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision_on_device_keeps_order(device) -> None:
    data = pairs()
    emb = TableEmbeddings(dim=32)
    cpu = AscendFAISS.from_embeddings(data, emb, device="cpu")
    half = AscendFAISS.from_embeddings(data, emb, device=device, dtype="float16")
    q = data[10][1] + 0.05
    assert [d.page_content for d in half.similarity_search_by_vector(q, k=5)] == [
        d.page_content for d in cpu.similarity_search_by_vector(q, k=5)]
