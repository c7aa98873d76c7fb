"""Flat and IVF device indexes, k-means, MMR and the faiss backend against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vectorstore_test_helpers import lc_module

from langchain_ascend.errors import EmbeddingDimensionError, InvalidVectorError
from langchain_ascend.index.device_index import FlatIndex, to_matrix
from langchain_ascend.index.faiss_io import FaissIndex
from langchain_ascend.index.ivf import IVFIndex, assign, kmeans
from langchain_ascend.index.mmr import mmr_select

CPU = torch.device("cpu")


def brute_force(data: np.ndarray, queries: np.ndarray, metric: str, k: int):
    """Reference scores in float64: squared L2 / inner product / cosine distance."""
    d = data.astype(np.float64)
    q = queries.astype(np.float64)
    if metric == "l2":
        scores = ((q[:, None, :] - d[None]) ** 2).sum(-1)
        order = np.argsort(scores, axis=1, kind="stable")
    elif metric == "ip":
        scores = q @ d.T
        order = np.argsort(-scores, axis=1, kind="stable")
    else:
        cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
            d / np.linalg.norm(d, axis=1, keepdims=True)).T
        scores = 1 - cos
        order = np.argsort(scores, axis=1, kind="stable")
    top = order[:, :k]
    return np.take_along_axis(scores, top, 1), top


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(300, 24)).astype(np.float32)


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_flat_search_equals_brute_force(data, metric) -> None:
    index = FlatIndex(24, metric, device=CPU)
    index.add(torch.from_numpy(data[:120]))
    index.add(torch.from_numpy(data[120:]))  # growth keeps earlier rows
    queries = np.random.default_rng(1).normal(size=(9, 24)).astype(np.float32)
    q = torch.from_numpy(queries)
    if metric == "cosine":
        q = q / q.norm(dim=1, keepdim=True)
    result = index.search(q, 7)
    want_scores, want_rows = brute_force(data, queries, metric, 7)
    assert result.rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(result.scores.numpy(), want_scores, rtol=1e-5, atol=1e-4)
    single = index.search(q[:1], 7)  # the matrix-vector path
    assert single.rows.tolist() == want_rows[:1].tolist()


def test_mask_applies_before_top_k(data) -> None:
    index = FlatIndex(24, "l2", device=CPU)
    index.add(torch.from_numpy(data))
    allowed = torch.zeros(300, dtype=torch.bool)
    allowed[::37] = True  # 9 rows, far from most queries
    result = index.search(torch.from_numpy(data[:2]), 5, allowed)
    assert (result.rows >= 0).all()
    assert set(result.rows.flatten().tolist()) <= set(range(0, 300, 37))
    few = index.search(torch.from_numpy(data[:1]), 20, allowed)  # k > matching rows
    assert (few.rows >= 0).sum().item() == 9
    assert few.rows.shape == (1, 20) and (few.rows[0, 9:] == -1).all()


def test_remove_compacts_and_update_overwrites(data) -> None:
    index = FlatIndex(24, "l2", device=CPU)
    index.add(torch.from_numpy(data[:10]))
    index.remove(torch.tensor([0, 4, 9]))
    kept = [1, 2, 3, 5, 6, 7, 8]
    assert index.ntotal == 7
    assert torch.equal(index.vectors(), torch.from_numpy(data[kept]))
    index.update(torch.tensor([2]), torch.from_numpy(data[50:51]))
    assert index.search(torch.from_numpy(data[50:51]), 1).rows.item() == 2
    assert index.search(torch.from_numpy(data[50:51]), 1).scores.item() == pytest.approx(0, abs=1e-5)


def test_half_precision_storage_keeps_exact_rescoring(data) -> None:
    index = FlatIndex(24, "l2", device=CPU, dtype=torch.float16)
    index.add(torch.from_numpy(data))
    queries = np.random.default_rng(2).normal(size=(5, 24)).astype(np.float32)
    result = index.search(torch.from_numpy(queries), 5)
    want_scores, want_rows = brute_force(index.vectors().float().numpy(), queries, "l2", 5)
    assert result.rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(result.scores.numpy(), want_scores, rtol=1e-4)


def test_to_matrix_validates() -> None:
    with pytest.raises(InvalidVectorError, match="position 1 has length 2"):
        to_matrix([[1.0, 2.0, 3.0], [1.0, 2.0]], device=CPU)
    with pytest.raises(InvalidVectorError, match="position 1 contains NaN"):
        to_matrix([[1.0, 2.0], [float("nan"), 0.0]], device=CPU)
    with pytest.raises(InvalidVectorError, match="2-D"):
        to_matrix(np.zeros((2, 2, 2)), device=CPU)
    with pytest.raises(EmbeddingDimensionError, match="dimension 3 but the index holds dimension 2"):
        to_matrix([[1.0, 2.0, 3.0]], device=CPU, dim=2)
    with pytest.raises(InvalidVectorError):
        to_matrix([["a", "b"]], device=CPU)


def clustered(num: int, dim: int, centers: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(centers, dim)) * 4
    labels = rng.integers(0, centers, size=num)
    return (means[labels] + rng.normal(size=(num, dim))).astype(np.float32)


def test_kmeans_finds_separated_clusters() -> None:
    points = clustered(600, 8, 6, seed=3)
    centroids = kmeans(torch.from_numpy(points), 6, iters=20, seed=0)
    labels = assign(torch.from_numpy(points), centroids, "l2")
    assert torch.bincount(labels, minlength=6).min() > 0  # no empty cluster


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_ivf_probing_all_lists_is_exact(metric) -> None:
    points = clustered(800, 16, 10, seed=4)
    index = IVFIndex(16, metric, device=CPU, nlist=10, nprobe=10, min_train_size=100)
    index.add(torch.from_numpy(points))
    queries = torch.from_numpy(clustered(6, 16, 10, seed=5))
    if metric == "cosine":
        queries = queries / queries.norm(dim=1, keepdim=True)
    result = index.search(queries, 5)
    assert index.is_trained
    want_scores, want_rows = brute_force(points, queries.numpy(), metric, 5)
    assert result.rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(result.scores.numpy(), want_scores, rtol=1e-5, atol=1e-4)


def test_ivf_recall_and_writes_after_training() -> None:
    points = clustered(3000, 16, 30, seed=6)
    index = IVFIndex(16, "l2", device=CPU, nlist=30, nprobe=4, min_train_size=500)
    index.add(torch.from_numpy(points[:2000]))
    queries = torch.from_numpy(points[:50] + 0.01)
    index.search(queries[:1], 1)  # trains
    index.add(torch.from_numpy(points[2000:]))  # assigned to lists without retraining
    index.remove(torch.tensor([0, 1, 2]))
    result = index.search(queries, 10)
    _, want = brute_force(index.vectors().numpy(), queries.numpy(), "l2", 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(result.rows.tolist(), want, strict=True)])
    assert recall >= 0.95
    assert index.assignments().shape == (2997,)


def test_ivf_filter_never_starves() -> None:
    points = clustered(2000, 16, 20, seed=8)
    index = IVFIndex(16, "l2", device=CPU, nlist=20, nprobe=1, min_train_size=100)
    index.add(torch.from_numpy(points))
    allowed = torch.zeros(2000, dtype=torch.bool)
    allowed[1500:] = True  # many rows, most outside the probed list
    result = index.search(torch.from_numpy(points[:3]), 10, allowed)
    assert (result.rows >= 1500).all()
    _, want = brute_force(points[1500:], points[:3], "l2", 10)
    assert (result.rows - 1500).tolist() == want.tolist()  # the fallback is exact


def test_mmr_matches_langchain_community_rule() -> None:
    maximal_marginal_relevance = lc_module("langchain_community.vectorstores.utils"
                                           ).maximal_marginal_relevance
    rng = np.random.default_rng(9)
    for _ in range(20):
        cands = rng.normal(size=(15, 8)).astype(np.float32)
        query = rng.normal(size=8).astype(np.float32)
        lam = float(rng.uniform(0, 1))
        want = maximal_marginal_relevance(query, list(cands), lambda_mult=lam, k=6)
        got = mmr_select(torch.from_numpy(query), torch.from_numpy(cands), 6, lam)
        assert got == want
    assert mmr_select(torch.zeros(8), torch.zeros(0, 8), 3) == []


@pytest.mark.parametrize("factory", ["Flat", "IVF8,Flat", "PQ4x4", "HNSW8"])
def test_faiss_backend_row_contract(data, factory) -> None:
    nprobe = 8 if factory.startswith("IVF") else None
    index = FaissIndex.create(factory, 24, "l2", device=CPU, nprobe=nprobe)
    index.add(torch.from_numpy(data))
    deletes = factory != "HNSW8"  # HNSW cannot delete (tested below)
    if deletes:
        index.remove(torch.tensor([0, 5]))
    assert index.ntotal == (298 if deletes else 300)
    allowed = torch.zeros(index.ntotal, dtype=torch.bool)
    allowed[100:110] = True  # PQ takes no selector: the widening search must still find 4
    result = index.search(torch.from_numpy(data[:2]), 4, allowed)
    assert ((result.rows >= 100) & (result.rows < 110)).all()
    if factory in ("Flat", "IVF8,Flat"):
        exact = index.search(torch.from_numpy(data[10:11]), 1)
        assert exact.rows.item() == 8  # row 10 moved to 8 after two deletes
        np.testing.assert_allclose(index.reconstruct(torch.tensor([8])).numpy(), data[10:11])


def test_faiss_backend_errors_are_typed() -> None:
    from langchain_ascend.errors import VectorStoreInputError

    with pytest.raises(VectorStoreInputError, match="factory string"):
        FaissIndex.create("NotAnIndex", 8, "l2", device=CPU)
    index = FaissIndex.create("IVF64,Flat", 8, "l2", device=CPU)
    with pytest.raises(VectorStoreInputError, match="training faiss index"):
        index.add(torch.zeros(10, 8))
    assert index.ntotal == 0
    hnsw = FaissIndex.create("HNSW8", 8, "l2", device=CPU)
    hnsw.add(torch.randn(20, 8))
    with pytest.raises(VectorStoreInputError, match="cannot delete"):
        hnsw.remove(torch.tensor([1]))
