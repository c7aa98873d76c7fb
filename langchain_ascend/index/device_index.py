"""Exact (flat) vector search as device tensors: one matmul + top-k per batch of queries.

Rows are dense ``0..ntotal-1`` in insertion order; :meth:`FlatIndex.remove` compacts and keeps
the relative order of the survivors (as faiss ``IndexFlat.remove_ids`` does), so the store's
row -> id list stays aligned by applying the same deletion.

Scores returned by :meth:`FlatIndex.search` are what ``langchain_community`` FAISS reports:

* ``"l2"``: SQUARED Euclidean distance, ascending (faiss ``IndexFlatL2`` returns squared L2);
* ``"ip"``: inner product, descending;
* ``"cosine"``: cosine distance ``1 - cos``, ascending (a real cosine, unlike lc FAISS, whose
  COSINE strategy silently searches an L2 index).

Selection runs on a ranking score (``2 q.x - |x|^2`` for L2, ``q.x`` for IP, ``q.x / |x|`` for
cosine) with masked-out rows set to ``-inf`` before top-k, so a filter never starves the
result. The few selected rows are then re-scored exactly in float32 (``sum((x - q)^2)`` for
L2, which avoids the cancellation of the norm expansion) and re-sorted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import EmbeddingDimensionError, InvalidVectorError

if TYPE_CHECKING:
    import torch

METRICS = ("l2", "ip", "cosine")
_SCORE_ELEMENTS_PER_CHUNK = 1 << 25  # (B, N) float32 score block: 128 MiB


def _torch() -> Any:
    import torch

    return torch


def higher_is_better(metric: str) -> bool:
    """True when a larger raw score means more similar (only inner product)."""
    return metric == "ip"


def to_matrix(vectors: Any, *, device: Any, dim: int | None = None) -> torch.Tensor:
    """Validate vectors and return a float32 ``(n, D)`` tensor on ``device``.

    Args:
        vectors: A list of equal-length number sequences, a 2-D numpy array or tensor.
        device: Target device.
        dim: Expected width, or None to accept any.

    Raises:
        InvalidVectorError: Ragged rows, non-numbers, not 2-D, NaN or infinity.
        EmbeddingDimensionError: Width differs from ``dim``.
    """
    torch = _torch()
    if isinstance(vectors, torch.Tensor):
        matrix = vectors.detach()
    else:
        try:
            import numpy as np

            if isinstance(vectors, np.ndarray):
                matrix = torch.from_numpy(np.ascontiguousarray(vectors))
            else:
                rows = vectors if isinstance(vectors, Sequence) else list(vectors)
                first = rows[0] if len(rows) else None
                if isinstance(first, torch.Tensor):  # rows that are tensors: no Python floats
                    matrix = torch.stack([row.reshape(-1) for row in rows])
                elif isinstance(first, np.ndarray):
                    matrix = torch.from_numpy(np.stack([row.reshape(-1) for row in rows]))
                else:
                    matrix = torch.tensor(rows, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidVectorError(_describe_bad_rows(vectors, exc)) from exc
    if matrix.dim() == 1 and matrix.numel() == 0:
        matrix = matrix.reshape(0, dim or 0)
    if matrix.dim() != 2:
        raise InvalidVectorError(
            f"expected a 2-D batch of vectors (n, dim), got shape {tuple(matrix.shape)}")
    if not (matrix.is_floating_point() or matrix.dtype in (torch.int32, torch.int64)):
        raise InvalidVectorError(f"vectors must be numbers, got dtype {matrix.dtype}")
    if dim is not None and matrix.shape[0] > 0 and matrix.shape[1] != dim:
        raise EmbeddingDimensionError(
            f"vectors have dimension {matrix.shape[1]} but the index holds dimension {dim}")
    matrix = matrix.to(device=device, dtype=torch.float32)
    finite = torch.isfinite(matrix).all(dim=1)  # (n,)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0, 0])
        raise InvalidVectorError(f"vector at position {bad} contains NaN or infinity")
    return matrix


def _describe_bad_rows(vectors: Any, exc: Exception) -> str:
    try:
        rows = list(vectors)
        width = len(rows[0])
        for i, row in enumerate(rows):
            if len(row) != width:
                return f"vector at position {i} has length {len(row)}, expected {width}"
    except Exception:  # noqa: BLE001 - only used to word the message
        pass
    return f"vectors must be equal-length sequences of numbers ({exc})"


def take_rows(tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``tensor[rows]`` for any shape of ``rows`` via ``index_select``.

    Advanced indexing with an index tensor is far slower on CPU (it runs a generic
    multi-threaded kernel even for a handful of rows); ``index_select`` copies rows directly.
    """
    picked = tensor.index_select(0, rows.reshape(-1))  # (numel, ...)
    return picked.reshape(*rows.shape, *tensor.shape[1:])


def l2_normalize(matrix: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length; zero rows stay zero (as faiss.normalize_L2)."""
    norms = matrix.norm(dim=1, keepdim=True)  # (n, 1)
    return matrix / norms.clamp_min(1e-30)


@dataclass
class SearchResult:
    """Top-k of a batch of queries, on the index device.

    Attributes:
        scores: (B, k) float32 raw scores (see module docstring); padding is +-inf.
        rows: (B, k) int64 row numbers; -1 where fewer than k rows were eligible.
    """

    scores: torch.Tensor
    rows: torch.Tensor


def empty_result(num_queries: int, device: Any) -> SearchResult:
    """A result with no columns, for an empty index or ``k == 0``."""
    torch = _torch()
    return SearchResult(torch.empty(num_queries, 0, device=device),
                        torch.empty(num_queries, 0, dtype=torch.int64, device=device))


class FlatIndex:
    """Exact search over vectors held in one device tensor.

    Storage layout (chosen so a single query costs one matrix-vector product and one top-k):

    * L2, float32: each row is ``[x, -|x|^2 / 2]``; with the query as ``[q, 1]`` one product
      gives ``q.x - |x|^2 / 2``, which ranks like ``-|q - x|^2``.
    * cosine: rows stored at unit length (their norms kept for reconstruction); the query is
      normalised, so the product is the cosine.
    * inner product, and L2 in float16/bfloat16: the vectors as given.

    Args:
        dim: Vector width.
        metric: ``"l2"``, ``"ip"`` or ``"cosine"``.
        device: A resolved ``torch.device``.
        dtype: Storage dtype (float32; float16/bfloat16 halve memory and bandwidth at a small
            cost in precision; selected rows are re-scored in float32 either way).
    """

    kind = "flat"

    def __init__(self, dim: int, metric: str, *, device: Any, dtype: Any = None) -> None:
        torch = _torch()
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}: use one of {METRICS}")
        self.dim = int(dim)
        self.metric = metric
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self._augmented = metric == "l2" and self.dtype == torch.float32
        self._width = self.dim + 1 if self._augmented else self.dim
        self._n = 0
        self._data = torch.empty(0, self._width, dtype=self.dtype, device=self.device)  # (cap, W)
        self._sq_norms = torch.empty(0, dtype=torch.float32, device=self.device)  # (cap,) raw

    # ---- size and storage -------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        """Number of stored vectors (the faiss attribute name)."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def vectors(self) -> torch.Tensor:
        """(N, D) the vectors as added (float32 for cosine, else the storage dtype)."""
        return self._original(self._data[: self._n], self._sq_norms[: self._n])

    def _original(self, stored: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor:
        if self.metric == "cosine":
            return stored.float() * sq_norms.sqrt().unsqueeze(-1)
        return stored[..., : self.dim]

    def _reserve(self, needed: int) -> None:
        torch = _torch()
        capacity = self._data.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity + capacity // 2, 1024)
        data = torch.empty(new_capacity, self._width, dtype=self.dtype, device=self.device)
        data[: self._n] = self._data[: self._n]
        norms = torch.empty(new_capacity, dtype=torch.float32, device=self.device)
        norms[: self._n] = self._sq_norms[: self._n]
        self._data, self._sq_norms = data, norms

    def _encode(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows in the storage layout and their raw squared norms, from (n, D) float32."""
        torch = _torch()
        vectors = vectors.to(device=self.device, dtype=torch.float32)
        sq_norms = (vectors * vectors).sum(dim=1)  # (n,)
        if self.metric == "cosine":
            vectors = vectors / sq_norms.sqrt().clamp_min(1e-30).unsqueeze(1)
        if self._augmented:
            vectors = torch.cat([vectors, -0.5 * sq_norms.unsqueeze(1)], dim=1)  # (n, D+1)
        return vectors.to(self.dtype), sq_norms

    # ---- writes -------------------------------------------------------------------------
    def add(self, vectors: torch.Tensor) -> None:
        """Append ``(n, D)`` float32 vectors as rows ``ntotal .. ntotal+n-1``."""
        count = vectors.shape[0]
        if count == 0:
            return
        stored, sq_norms = self._encode(vectors)
        self._reserve(self._n + count)
        self._data[self._n : self._n + count] = stored
        self._sq_norms[self._n : self._n + count] = sq_norms
        self._n += count

    def update(self, rows: torch.Tensor, vectors: torch.Tensor) -> None:
        """Overwrite the given rows in place (upsert of existing ids)."""
        if rows.numel() == 0:
            return
        stored, sq_norms = self._encode(vectors)
        rows = rows.to(self.device)
        self._data.index_copy_(0, rows, stored)
        self._sq_norms.index_copy_(0, rows, sq_norms)

    def remove(self, rows: torch.Tensor) -> None:
        """Delete rows and compact; survivors keep their relative order."""
        torch = _torch()
        if rows.numel() == 0:
            return
        keep = torch.ones(self._n, dtype=torch.bool, device=self.device)
        keep[rows.to(self.device)] = False
        survivors = keep.nonzero().flatten()  # (N',) ascending: order kept
        self._data = self._data.index_select(0, survivors)
        self._sq_norms = self._sq_norms.index_select(0, survivors)
        self._n = int(self._data.shape[0])

    def reconstruct(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, D) float32 copies of the given rows."""
        rows = rows.to(self.device)
        return self._original(take_rows(self._data, rows), take_rows(self._sq_norms, rows)).float()

    # ---- search -------------------------------------------------------------------------
    def _rescores(self) -> bool:
        """Whether selected rows get an exact float32 re-score (L2 or reduced precision)."""
        return self.metric == "l2" or self.dtype != _torch().float32

    def _extra_candidates(self, k: int) -> int:
        """How many more rows than ``k`` to select before exact re-scoring."""
        if self.dtype != _torch().float32:
            return k + 16
        return 8 if self.metric == "l2" else 0

    def query_operand(self, queries: torch.Tensor) -> torch.Tensor:
        """(B, W) queries in the storage layout (``[q, 1]`` for augmented L2)."""
        torch = _torch()
        if self._augmented:
            ones = torch.ones(queries.shape[0], 1, dtype=queries.dtype, device=queries.device)
            queries = torch.cat([queries, ones], dim=1)
        return queries.to(self.dtype)

    def finish_ranking(self, dots: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """Turn products with stored rows into float32 larger-is-better scores (in place)."""
        dots = dots.float()
        if self.metric == "l2" and not self._augmented:  # 2 q.x - |x|^2 ranks like -|q-x|^2
            norms = self._sq_norms[: self._n] if rows is None else take_rows(self._sq_norms, rows)
            return dots.mul_(2.0).sub_(norms)
        return dots

    def ranking_scores(self, queries: torch.Tensor) -> torch.Tensor:
        """(B, N) float32 scores where larger is better, for all rows."""
        torch = _torch()
        data = self._data[: self._n]  # (N, W)
        operand = self.query_operand(queries)  # (B, W)
        if operand.shape[0] == 1:  # matrix-vector product: the memory-bound single query
            dots = torch.mv(data, operand[0]).unsqueeze(0)  # (1, N)
        else:
            dots = operand @ data.T  # (B, N)
        return self.finish_ranking(dots, None)

    def ranking_scores_of(self, queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(B, A) larger-is-better scores of the given rows (A,) only."""
        dots = self.query_operand(queries) @ take_rows(self._data, rows).T  # (B, A)
        return self.finish_ranking(dots, rows)

    def raw_from_ranking(self, ranking: torch.Tensor) -> torch.Tensor:
        """Raw scores from ranking scores where no re-scoring is needed (IP, cosine in fp32)."""
        return 1.0 - ranking if self.metric == "cosine" else ranking

    def exact_scores(self, queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(B, c) float32 raw scores of ``rows`` (B, c) for each query, computed directly."""
        cand = take_rows(self._data, rows.clamp_min(0))[..., : self.dim].float()  # (B, c, D)
        if self.metric == "l2":
            diff = cand - queries.unsqueeze(1)  # (B, c, D)
            return (diff * diff).sum(dim=-1)
        dots = (cand * queries.unsqueeze(1)).sum(dim=-1)  # (B, c)
        return 1.0 - dots if self.metric == "cosine" else dots

    def search(self, queries: torch.Tensor, k: int,
               mask: torch.Tensor | None = None) -> SearchResult:
        """Top-``k`` rows for each query among rows where ``mask`` is True.

        Args:
            queries: (B, D) float32 on this device (unit length for cosine).
            k: Results per query.
            mask: Optional (N,) bool; rows outside it are never returned.
        """
        torch = _torch()
        num_queries = queries.shape[0]
        if self._n == 0 or k <= 0:
            return empty_result(num_queries, self.device)
        chunk = max(1, _SCORE_ELEMENTS_PER_CHUNK // self._n)
        scores, rows = [], []
        for start in range(0, num_queries, chunk):
            block = queries[start : start + chunk]  # (b, D)
            ranking = self.ranking_scores(block)  # (b, N)
            if mask is not None:
                ranking.masked_fill_(~mask, float("-inf"))
            result = select_and_rescore(self, block, ranking, None, k)
            scores.append(result.scores)
            rows.append(result.rows)
        if len(scores) == 1:
            return SearchResult(scores[0], rows[0])
        return SearchResult(torch.cat(scores), torch.cat(rows))


def select_and_rescore(index: FlatIndex, queries: torch.Tensor, ranking: torch.Tensor,
                       candidate_rows: torch.Tensor | None, k: int) -> SearchResult:
    """Top-k of ``ranking``, re-scored exactly and re-sorted.

    Args:
        index: The index that holds the rows.
        queries: (B, D) float32.
        ranking: (B, C) larger-is-better scores; ``-inf`` marks ineligible entries.
        candidate_rows: (B, C) row numbers of the columns of ``ranking``, or None when column
            ``j`` is row ``j``.
        k: Results per query.

    Returns:
        Exactly ``min(k, index.ntotal)`` columns, padded with row -1 where fewer are eligible.
    """
    torch = _torch()
    num_queries = queries.shape[0]
    out_width = min(k, index.ntotal)
    take = min(ranking.shape[1], k + index._extra_candidates(k))
    if take == 0 or out_width == 0:
        return _padded(empty_result(num_queries, queries.device), out_width, index.metric)
    top_vals, top_cols = ranking.topk(take, dim=1)  # (B, take), sorted
    rows = top_cols if candidate_rows is None else candidate_rows.gather(1, top_cols)
    eligible = torch.isfinite(top_vals)  # (B, take)
    if not index._rescores():  # the ranking already is the exact score, in order
        scores = index.raw_from_ranking(top_vals[:, :out_width])
        rows = rows[:, :out_width].masked_fill(~eligible[:, :out_width], -1)
        return _padded(SearchResult(scores, rows), out_width, index.metric)
    exact = index.exact_scores(queries, rows)  # (B, take)
    descending = higher_is_better(index.metric)
    pad = float("-inf") if descending else float("inf")
    exact = exact.masked_fill(~eligible, pad)
    order = exact.argsort(dim=1, descending=descending, stable=True)[:, :out_width]  # (B, <=k)
    scores = exact.gather(1, order)
    rows = rows.gather(1, order).masked_fill(~eligible.gather(1, order), -1)
    return _padded(SearchResult(scores, rows), out_width, index.metric)


def _padded(result: SearchResult, width: int, metric: str) -> SearchResult:
    """Pad a result to ``width`` columns with row -1 and the worst score."""
    torch = _torch()
    missing = width - result.rows.shape[1]
    if missing <= 0:
        return result
    num_queries = result.rows.shape[0]
    device = result.rows.device
    pad = float("-inf") if higher_is_better(metric) else float("inf")
    return SearchResult(
        torch.cat([result.scores, torch.full((num_queries, missing), pad, device=device)], 1),
        torch.cat([result.rows, torch.full((num_queries, missing), -1, dtype=torch.int64,
                                           device=device)], 1))
