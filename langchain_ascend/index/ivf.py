"""Inverted-file (IVF) approximate search on the device: k-means lists, probe ``nprobe`` of them.

For corpora where an exact scan per query is too slow. Vectors stay in the flat row storage of
:class:`~langchain_ascend.index.device_index.FlatIndex` (so deletes, upserts, reconstruction and
persistence work the same); the index adds ``nlist`` centroids, one list number per row, and a
list-major copy of the vectors (rebuilt lazily after writes) in which each list is a
contiguous block. That copy doubles the vector memory of an IVF index.

Search: score the queries against the centroids (one matmul), take the ``nprobe`` best lists,
run one matrix-vector product per probed list, top-k, re-score exactly. A filter mask applies
to the candidates before top-k; if the probed lists hold fewer than ``k`` matching rows while
the corpus holds more, that query is answered by an exact scan of the matching rows instead,
so a filter never starves the result. Until the index holds ``min_train_size`` vectors it
answers exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from langchain_ascend.index.device_index import (
    FlatIndex,
    SearchResult,
    empty_result,
    l2_normalize,
    select_and_rescore,
    take_rows,
)
from langchain_ascend.validation import STORE, check_count

if TYPE_CHECKING:
    import torch

_ASSIGN_ELEMENTS_PER_CHUNK = 1 << 24  # (rows, nlist) float32 block: 64 MiB


def _torch() -> Any:
    import torch

    return torch


def default_nlist(num_vectors: int) -> int:
    """About ``4 * sqrt(N)`` lists (the usual faiss guidance), at least 1."""
    return max(1, int(4 * math.sqrt(max(num_vectors, 1))))


def assign(vectors: torch.Tensor, centroids: torch.Tensor, metric: str) -> torch.Tensor:
    """(n,) int64 number of the best centroid for each row, computed in chunks.

    L2 picks the nearest centroid; ``"ip"``/``"cosine"`` the largest inner product.
    """
    torch = _torch()
    out = torch.empty(vectors.shape[0], dtype=torch.int64, device=vectors.device)
    c_sq = (centroids * centroids).sum(dim=1)  # (nlist,)
    chunk = max(1, _ASSIGN_ELEMENTS_PER_CHUNK // max(centroids.shape[0], 1))
    for start in range(0, vectors.shape[0], chunk):
        block = vectors[start : start + chunk].float()  # (b, D)
        if metric == "l2":
            scores = torch.addmm(c_sq, block, centroids.T, beta=-1.0, alpha=2.0)  # (b, nlist)
        else:
            scores = block @ centroids.T
        out[start : start + chunk] = scores.argmax(dim=1)
    return out


def kmeans(vectors: torch.Tensor, num_clusters: int, *, metric: str = "l2", iters: int = 12,
           max_points_per_centroid: int = 64, seed: int = 0) -> torch.Tensor:
    """Lloyd's k-means on the device; returns ``(num_clusters, D)`` float32 centroids.

    Trains on at most ``max_points_per_centroid * num_clusters`` sampled rows (as faiss does).
    Starts from distinct random rows; an empty cluster takes half of the largest one (its
    centroid is split in two by a small perturbation). For ``"ip"``/``"cosine"`` the
    centroids are kept at unit length (spherical k-means).

    Raises:
        ValueError: Fewer rows than clusters.
    """
    torch = _torch()
    num_rows = vectors.shape[0]
    if num_rows < num_clusters:
        raise ValueError(f"k-means needs at least {num_clusters} vectors, got {num_rows}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    sample_size = min(num_rows, max_points_per_centroid * num_clusters)
    picked = torch.randperm(num_rows, generator=generator)[:sample_size].to(vectors.device)
    train = vectors[picked].float()  # (S, D)
    spherical = metric != "l2"
    if spherical:
        train = l2_normalize(train)
    centroids = train[:num_clusters].clone()  # (K, D): distinct random rows
    for _ in range(iters):
        labels = assign(train, centroids, "l2" if not spherical else "ip")  # (S,)
        sums = torch.zeros_like(centroids).index_add_(0, labels, train)  # (K, D)
        counts = torch.bincount(labels, minlength=num_clusters).float()  # (K,)
        filled = counts > 0
        centroids = torch.where(filled.unsqueeze(1), sums / counts.clamp_min(1).unsqueeze(1),
                                centroids)
        _split_empty_clusters(centroids, counts, generator)
        if spherical:
            centroids = l2_normalize(centroids)
    return centroids


def _split_empty_clusters(centroids: torch.Tensor, counts: torch.Tensor,
                          generator: torch.Generator) -> None:
    """Give each empty cluster half of the currently largest cluster (in place)."""
    torch = _torch()
    empty = (counts == 0).nonzero().flatten().tolist()
    if not empty:
        return
    counts = counts.clone()
    for cluster in empty:
        largest = int(counts.argmax())
        noise = torch.randn(centroids.shape[1], generator=generator).to(centroids.device) * 1e-4
        base = centroids[largest].clone()
        centroids[cluster] = base * (1 + noise)
        centroids[largest] = base * (1 - noise)
        counts[cluster] = counts[largest] / 2
        counts[largest] = counts[largest] / 2


class IVFIndex(FlatIndex):
    """IVF search over a flat row storage (see the module docstring).

    Args:
        dim: Vector width.
        metric: ``"l2"``, ``"ip"`` or ``"cosine"``.
        device: A resolved ``torch.device``.
        dtype: Storage dtype.
        nlist: Number of lists; None picks ``4 * sqrt(N)`` when training.
        nprobe: Lists probed per query; None picks ``max(1, nlist // 16)``.
        min_train_size: Below this many vectors searches are exact and nothing is trained;
            None means ``8 * nlist`` (or 1,024 when ``nlist`` is None).
        kmeans_iters: Lloyd iterations.
        seed: Seed of the k-means sampling and initialisation.
    """

    kind = "ivf"

    def __init__(self, dim: int, metric: str, *, device: Any, dtype: Any = None,
                 nlist: int | None = None, nprobe: int | None = None,
                 min_train_size: int | None = None, kmeans_iters: int = 12,
                 seed: int = 0) -> None:
        super().__init__(dim, metric, device=device, dtype=dtype)
        check_count("nlist", nlist, allow_none=True, errors=STORE)
        check_count("nprobe", nprobe, allow_none=True, errors=STORE)
        self.nlist_setting = nlist
        self.nprobe_setting = nprobe
        self.min_train_size = min_train_size
        self.kmeans_iters = kmeans_iters
        self.seed = seed
        self.centroids: torch.Tensor | None = None  # (nlist, D) float32
        self._centroid_bias: torch.Tensor | None = None  # (nlist,) -|c|^2/2 for L2, else 0
        self._rows_cpu = np.zeros(0, dtype=np.int64)  # rows sorted by list (host)
        self._offsets_cpu = np.zeros(1, dtype=np.int64)  # list l is [offsets[l], offsets[l+1])
        self._lists = _torch().empty(0, dtype=_torch().int64, device=self.device)  # (cap,)
        self._list_data: torch.Tensor | None = None  # (N, W) rows in list order
        self.trained_size = 0

    # ---- configuration ------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        """Whether centroids exist (searches are approximate from then on)."""
        return self.centroids is not None

    @property
    def nlist(self) -> int:
        """Lists in use (or the value training will use)."""
        if self.centroids is not None:
            return int(self.centroids.shape[0])
        return self.nlist_setting or default_nlist(self._n)

    @property
    def nprobe(self) -> int:
        """Lists probed per query."""
        probe = self.nprobe_setting or max(1, self.nlist // 16)
        return min(probe, self.nlist)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        check_count("nprobe", value, errors=STORE)
        self.nprobe_setting = int(value)

    def _train_threshold(self) -> int:
        if self.min_train_size is not None:
            return self.min_train_size
        return 8 * self.nlist_setting if self.nlist_setting else 1024

    # ---- training -----------------------------------------------------------------------
    def train(self) -> None:
        """Run k-means on the stored vectors and assign every row to a list."""
        if self._n == 0:
            return
        nlist = min(self.nlist_setting or default_nlist(self._n), self._n)
        data = self.vectors().float()
        self.set_centroids(kmeans(data, nlist, metric=self.metric, iters=self.kmeans_iters,
                                  seed=self.seed))

    def set_centroids(self, centroids: torch.Tensor,
                      assignments: torch.Tensor | None = None) -> None:
        """Install centroids (from training or a saved index) and (re)assign rows."""
        self.centroids = centroids.to(device=self.device, dtype=_torch().float32)
        self._centroid_bias = (-0.5 * (self.centroids * self.centroids).sum(dim=1)
                               if self.metric == "l2" else
                               _torch().zeros(self.centroids.shape[0], device=self.device))
        if assignments is None:
            assignments = assign(self._assign_view(self.vectors()), self.centroids,
                                 self._assign_metric())
        self._lists = assignments.to(device=self.device, dtype=_torch().int64).clone()
        self._list_data = None
        self.trained_size = self._n

    def _assign_metric(self) -> str:
        return "l2" if self.metric == "l2" else "ip"

    def _assign_view(self, stored: torch.Tensor) -> torch.Tensor:
        data = stored.float()
        return l2_normalize(data) if self.metric == "cosine" else data

    def assignments(self) -> torch.Tensor | None:
        """(N,) list number of each row, or None before training."""
        return self._lists[: self._n] if self.centroids is not None else None

    # ---- writes -------------------------------------------------------------------------
    def add(self, vectors: torch.Tensor) -> None:
        start = self._n
        super().add(vectors)
        if self.centroids is not None and vectors.shape[0]:
            new = assign(self._assign_view(vectors), self.centroids, self._assign_metric())
            self._lists = _torch().cat([self._lists[:start], new])
            self._list_data = None

    def update(self, rows: torch.Tensor, vectors: torch.Tensor) -> None:
        super().update(rows, vectors)
        if self.centroids is not None and rows.numel():
            self._lists.index_copy_(0, rows.to(self.device), assign(
                self._assign_view(vectors), self.centroids, self._assign_metric()))
            self._list_data = None

    def remove(self, rows: torch.Tensor) -> None:
        torch = _torch()
        if rows.numel() == 0:
            return
        if self.centroids is not None:
            keep = torch.ones(self._n, dtype=torch.bool, device=self.device)
            keep[rows.to(self.device)] = False
            self._lists = self._lists[: self._n].index_select(0, keep.nonzero().flatten())
            self._list_data = None
        super().remove(rows)

    # ---- search -------------------------------------------------------------------------
    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows grouped by list: ``(host rows sorted by list, host offsets)``.

        The vectors are also kept in list-major order (``_list_data``: rows
        ``offsets[l]:offsets[l+1]`` belong to list ``l``), so each probed list is one contiguous
        matrix-vector product with no gather. This copy doubles the vector memory of an IVF
        index; it is rebuilt lazily after writes.
        """
        torch = _torch()
        if self._list_data is None:
            assert self.centroids is not None
            lists = self._lists[: self._n]
            order = lists.argsort(stable=True)  # (N,) rows grouped by list
            sizes = torch.bincount(lists, minlength=self.nlist)  # (nlist,)
            self._list_data = self._data.index_select(0, order)  # (N, W) list-major copy
            self._rows_cpu = order.cpu().numpy()
            self._offsets_cpu = np.concatenate([[0], np.cumsum(sizes.cpu().numpy())])
        return self._rows_cpu, self._offsets_cpu

    def _maybe_train(self) -> None:
        if self.centroids is None:
            if self._n >= self._train_threshold():
                self.train()
        elif self._n >= 4 * max(self.trained_size, 1) and self.nlist_setting is None:
            self.train()

    def search(self, queries: torch.Tensor, k: int,
               mask: torch.Tensor | None = None) -> SearchResult:
        torch = _torch()
        if self._n == 0 or k <= 0:
            return empty_result(queries.shape[0], self.device)
        self._maybe_train()
        if self.centroids is None:
            return super().search(queries, k, mask)
        rows_cpu, offsets_cpu = self._layout()
        probe = min(self.nprobe, self.nlist)
        allowed = None if mask is None else int(mask.sum())
        if mask is not None and allowed is not None and (
                allowed <= probe * math.ceil(self._n / self.nlist)):
            return self._search_subset(queries, k, mask)
        probed = self._coarse_scores(queries).topk(probe, dim=1).indices.tolist()  # (B, P)
        parts = [self._probe_one(queries[i : i + 1], k, lists, rows_cpu, offsets_cpu, mask)
                 for i, lists in enumerate(probed)]
        if len(parts) == 1:
            result = parts[0]
        else:
            result = SearchResult(torch.cat([p.scores for p in parts]),
                                  torch.cat([p.rows for p in parts]))
        if mask is not None:
            result = self._fill_starved(queries, k, mask, allowed or 0, result)
        return result

    def _coarse_scores(self, queries: torch.Tensor) -> torch.Tensor:
        """(B, nlist) larger-is-better list scores (``q.c - |c|^2 / 2`` for L2)."""
        assert self.centroids is not None and self._centroid_bias is not None
        if queries.shape[0] == 1:
            return (_torch().mv(self.centroids, queries[0]) + self._centroid_bias).unsqueeze(0)
        return _torch().addmm(self._centroid_bias, queries, self.centroids.T)

    def _probe_one(self, query: torch.Tensor, k: int, lists: list[int], rows_cpu: np.ndarray,
                   offsets_cpu: np.ndarray, mask: torch.Tensor | None) -> SearchResult:
        """One query: a matrix-vector product per probed list over the list-major copy."""
        torch = _torch()
        spans = [(int(offsets_cpu[c]), int(offsets_cpu[c + 1])) for c in lists]
        spans = [(a, b) for a, b in spans if b > a]
        if not spans:
            return select_and_rescore(self, query, torch.empty(1, 0, device=self.device),
                                      torch.empty(1, 0, dtype=torch.int64, device=self.device), k)
        assert self._list_data is not None
        operand = self.query_operand(query)[0]  # (W,)
        dots = torch.cat([torch.mv(self._list_data[a:b], operand) for a, b in spans])  # (C,)
        picked = np.concatenate([rows_cpu[a:b] for a, b in spans])
        cand = torch.from_numpy(picked).to(self.device).unsqueeze(0)  # (1, C)
        ranking = self.finish_ranking(dots.unsqueeze(0), cand)  # (1, C)
        if mask is not None:
            ranking.masked_fill_(~take_rows(mask, cand), float("-inf"))
        return select_and_rescore(self, query, ranking, cand, k)

    def _search_subset(self, queries: torch.Tensor, k: int, mask: torch.Tensor) -> SearchResult:
        """Exact scan of the rows in ``mask`` only (few enough to be cheap)."""
        rows = mask.nonzero().flatten()  # (A,)
        if rows.numel() == 0:
            return empty_result(queries.shape[0], self.device)
        cand = rows.unsqueeze(0).expand(queries.shape[0], -1)  # (B, A)
        ranking = self.ranking_scores_of(queries, rows)  # (B, A)
        return select_and_rescore(self, queries, ranking, cand, k)

    def _fill_starved(self, queries: torch.Tensor, k: int, mask: torch.Tensor, allowed: int,
                      result: SearchResult) -> SearchResult:
        """Re-answer exactly the queries whose probed lists held too few matching rows."""
        found = (result.rows >= 0).sum(dim=1)  # (B,)
        starved = (found < min(k, allowed)).nonzero().flatten()
        if starved.numel() == 0:
            return result
        exact = FlatIndex.search(self, queries[starved], k, mask)
        scores = result.scores.clone()
        rows = result.rows.clone()
        width = exact.rows.shape[1]
        scores[starved, :width] = exact.scores
        rows[starved, :width] = exact.rows
        return SearchResult(scores, rows)
