"""faiss (CPU) side: a faiss-backed index for corpora that do not fit device memory (faiss
files and lc FAISS folders are read and written by :mod:`langchain_ascend.index.persist`).

:class:`FaissIndex` keeps the same row contract as the device indexes (dense rows in insertion
order, deletes compact) on top of any faiss index built from a factory string
(``"IVF4096,PQ64"``, ``"HNSW32"``, ``"Flat"``...). Each row carries a faiss label; indexes that
store labels (IVF family, ``IDMap``) keep them stable across deletes, the others (flat codes,
HNSW) are positional: label == row. Filters run inside faiss through an ``IDSelectorBatch`` so
they apply before top-k there too. For cosine, vectors are L2-normalised on the way in and an
inner-product index is used; reported scores are ``1 - cos``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from langchain_ascend.errors import IndexFormatError, VectorStoreInputError
from langchain_ascend.index.device_index import SearchResult, empty_result
from langchain_ascend.validation import STORE, check_count

if TYPE_CHECKING:
    import torch


def import_faiss() -> Any:
    """Import faiss with a clear error when it is missing."""
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is a dependency
        raise ImportError("faiss is not installed: pip install faiss-cpu") from exc
    return faiss


def faiss_metric(metric: str) -> int:
    """faiss metric constant for ``"l2"`` / ``"ip"`` / ``"cosine"``."""
    faiss = import_faiss()
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def metric_of(index: Any) -> str:
    """``"l2"`` or ``"ip"`` from a faiss index's metric type."""
    faiss = import_faiss()
    return "ip" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"


def flat_vectors(index: Any) -> np.ndarray | None:
    """The (N, D) float32 vectors of a plain ``IndexFlat*``; None for any other index type."""
    faiss = import_faiss()
    concrete = faiss.downcast_index(index)
    if type(concrete) not in (faiss.IndexFlat, faiss.IndexFlatL2, faiss.IndexFlatIP):
        return None
    if concrete.ntotal == 0:
        return np.zeros((0, concrete.d), dtype=np.float32)
    codes = faiss.vector_to_array(concrete.codes)
    return codes.view(np.float32).reshape(concrete.ntotal, concrete.d).copy()


def concrete_index(index: Any) -> Any:
    """``index`` as its concrete faiss class (``IndexHNSWFlat``, ``IndexIVFFlat``...), kept
    alive by what is returned: ``faiss.downcast_index`` gives a proxy that does not own the C++
    index, which is freed with the last reference to ``index`` (a search then asserted, found
    nothing or crashed). ``referenced_objects`` is faiss's own way of holding a dependency."""
    faiss = import_faiss()
    concrete = faiss.downcast_index(index)
    if concrete is not index and not concrete.thisown:
        concrete.referenced_objects = [index]
    return concrete


def _has_stored_labels(index: Any) -> bool:
    faiss = import_faiss()
    concrete = faiss.downcast_index(index)
    return faiss.try_extract_index_ivf(concrete) is not None or isinstance(
        concrete, (faiss.IndexIDMap, faiss.IndexIDMap2))


def _to_numpy(vectors: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(vectors.detach().float().cpu().numpy(), dtype=np.float32)


class FaissIndex:
    """A faiss index behind the row contract of the device indexes.

    Args:
        index: A faiss index (empty or already populated).
        metric: ``"l2"``, ``"ip"`` or ``"cosine"`` (cosine needs an inner-product index).
        device: Device of returned tensors (results go back to the store's device).
        row_labels: (N,) label of each row for a populated index that stores labels; None
            means labels ``0..N-1``.
        factory: The factory string it was built from, kept for persistence.
    """

    kind = "faiss"

    def __init__(self, index: Any, metric: str, *, device: Any, row_labels: Any = None,
                 factory: str | None = None) -> None:
        import torch

        self.index = index
        self.metric = metric
        self.factory = factory
        self.device = torch.device(device)
        self.dim = int(index.d)
        self._stored_labels = _has_stored_labels(index)
        count = int(index.ntotal)
        labels = np.arange(count, dtype=np.int64) if row_labels is None else np.asarray(
            row_labels, dtype=np.int64)
        if labels.shape != (count,):
            raise IndexFormatError(
                f"faiss index holds {count} vectors but {labels.shape[0]} row labels were given")
        self._row_labels = labels
        self._next_label = int(labels.max()) + 1 if count else 0
        self._label_to_row = self._invert(labels)
        self._can_remove: bool | None = None
        self._enable_reconstruct()

    @classmethod
    def create(cls, factory: str, dim: int, metric: str, *, device: Any,
               nprobe: int | None = None) -> FaissIndex:
        """Build an empty index from a faiss factory string.

        Raises:
            VectorStoreInputError: faiss rejects the factory string.
        """
        faiss = import_faiss()
        try:
            index = faiss.index_factory(int(dim), factory, faiss_metric(metric))
        except RuntimeError as exc:
            raise VectorStoreInputError(
                f"faiss cannot build an index from factory string {factory!r}: "
                f"{str(exc).strip().splitlines()[-1]}") from exc
        if not _has_stored_labels(index):
            if isinstance(faiss.downcast_index(index), faiss.IndexFlatCodes):
                index = faiss.IndexIDMap2(index)
        made = cls(index, metric, device=device, factory=factory)
        if nprobe is not None:
            made.nprobe = nprobe
        return made

    # ---- properties -----------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        """Number of stored vectors."""
        return int(self.index.ntotal)

    def __len__(self) -> int:
        return self.ntotal

    @property
    def row_labels(self) -> np.ndarray:
        """(N,) faiss label of each row."""
        return self._row_labels

    @property
    def nprobe(self) -> int | None:
        """Lists probed per query (IVF indexes only; None otherwise)."""
        ivf = import_faiss().try_extract_index_ivf(self.index)
        return None if ivf is None else int(ivf.nprobe)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        ivf = import_faiss().try_extract_index_ivf(self.index)
        if ivf is None:
            raise VectorStoreInputError("nprobe applies to IVF faiss indexes only")
        check_count("nprobe", value, errors=STORE)
        ivf.nprobe = int(value)

    def _enable_reconstruct(self) -> None:
        faiss = import_faiss()
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
            ivf.set_direct_map_type(faiss.DirectMap.Hashtable)

    def _invert(self, labels: np.ndarray) -> np.ndarray:
        size = int(labels.max()) + 1 if labels.size else 0
        table = np.full(size, -1, dtype=np.int64)
        table[labels] = np.arange(labels.size, dtype=np.int64)
        return table

    # ---- writes -----------------------------------------------------------------------------
    def _prepare(self, vectors: torch.Tensor) -> np.ndarray:
        array = _to_numpy(vectors)
        if self.metric == "cosine":
            import_faiss().normalize_L2(array)
        return array

    def add(self, vectors: torch.Tensor) -> None:
        """Append rows; trains the index on this batch first when it is untrained.

        Raises:
            VectorStoreInputError: Training failed (typically too few vectors for the lists
                or codebooks); nothing was added.
        """
        array = self._prepare(vectors)
        count = array.shape[0]
        if count == 0:
            return
        if not self.index.is_trained:
            try:
                self.index.train(array)
            except RuntimeError as exc:
                message = str(exc).strip().splitlines()[-1]
                raise VectorStoreInputError(
                    f"training faiss index {self.factory or type(self.index).__name__} on "
                    f"{count} vectors failed ({message}); add more vectors in the first call "
                    "or choose fewer lists / smaller codebooks") from exc
        labels = np.arange(self._next_label, self._next_label + count, dtype=np.int64)
        if self._stored_labels:
            self.index.add_with_ids(array, labels)
        else:
            self.index.add(array)
        self._row_labels = np.concatenate([self._row_labels, labels])
        self._next_label += count
        self._label_to_row = self._invert(self._row_labels)

    @property
    def can_remove(self) -> bool:
        """Whether this index type can delete vectors (HNSW cannot); probed once, with an
        empty removal, since wrappers (``PCA8,HNSW8``) inherit the ability of what they wrap."""
        if self._can_remove is None:
            faiss = import_faiss()
            nothing = np.zeros(1, dtype=np.int64)
            try:
                self.index.remove_ids(faiss.IDSelectorArray(0, faiss.swig_ptr(nothing)))
                self._can_remove = True
            except RuntimeError:
                self._can_remove = False
        return self._can_remove

    def cannot_remove_error(self, detail: str = "rebuild the store without them or use a "
                            "Flat / IVF index") -> VectorStoreInputError:
        """The error for a write that would need a deletion this index cannot do."""
        name = type(import_faiss().downcast_index(self.index)).__name__
        return VectorStoreInputError(f"this faiss index ({name}) cannot delete vectors; {detail}")

    def remove(self, rows: torch.Tensor) -> None:
        """Delete rows; the survivors keep their order.

        Raises:
            VectorStoreInputError: This faiss index type cannot delete (HNSW); nothing changed.
        """
        faiss = import_faiss()
        positions = rows.detach().cpu().numpy().astype(np.int64)
        if positions.size == 0:
            return
        if not self.can_remove:
            raise self.cannot_remove_error()
        labels = np.ascontiguousarray(self._row_labels[positions], dtype=np.int64)
        selector = faiss.IDSelectorArray(labels.size, faiss.swig_ptr(labels))  # keeps `labels`
        try:
            removed = self.index.remove_ids(selector)
        except RuntimeError as exc:
            raise self.cannot_remove_error() from exc
        if removed != labels.size:
            raise IndexFormatError(
                f"faiss removed {removed} vectors where {labels.size} were expected")
        survivors = np.delete(self._row_labels, positions)
        if not self._stored_labels:
            survivors = np.arange(survivors.size, dtype=np.int64)
            self._next_label = survivors.size
        self._row_labels = survivors
        self._label_to_row = self._invert(survivors)

    def reconstruct(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, D) float32 stored vectors (approximate for compressed indexes)."""
        import torch

        positions = rows.detach().cpu().numpy().astype(np.int64)
        out = np.stack([self.index.reconstruct(int(self._row_labels[p])) for p in positions]
                       ) if positions.size else np.zeros((0, self.dim), dtype=np.float32)
        return torch.from_numpy(out.astype(np.float32)).to(self.device)

    def vectors(self) -> torch.Tensor:
        """(N, D) reconstruction of all rows."""
        import torch

        return self.reconstruct(torch.arange(self.ntotal))

    # ---- search -------------------------------------------------------------------------------
    def search(self, queries: torch.Tensor, k: int,
               mask: torch.Tensor | None = None) -> SearchResult:
        """faiss search; ``mask`` becomes an ID selector so it applies before top-k.

        Index types whose search takes no selector (e.g. ``PQ``) are searched with a widening
        ``k`` instead (x4 per round) until every query has ``k`` allowed rows or the whole index
        was ranked, which gives the same rows as a selector would.

        Invariant (as on the device IVF): a query gets ``min(k, allowed rows)`` results. An
        approximate index can find fewer allowed rows than that (IVF: none in the probed
        lists; HNSW: the graph walk misses them), so such a query is answered by an exact
        scan of the allowed rows (their stored vectors, reconstructed) instead.
        """
        import torch

        num_queries = queries.shape[0]
        width = int(min(k, self.ntotal))
        if width <= 0:
            return empty_result(num_queries, self.device)
        array = self._prepare(queries)
        if mask is None:
            scores, rows = self._raw_search(array, width, None)
        else:
            allowed = mask.detach().cpu().numpy().astype(bool)
            try:
                scores, rows = self._raw_search(array, width, self._selector_params(allowed))
            except RuntimeError as exc:
                if "param" not in str(exc) and "selector" not in str(exc):
                    raise
                scores, rows = self._widening_search(array, width, allowed)
            scores, rows = self._fill_starved(array, width, allowed, scores, rows)
        return SearchResult(torch.from_numpy(scores).to(self.device),
                            torch.from_numpy(rows).to(self.device))

    def _fill_starved(self, array: np.ndarray, width: int, allowed: np.ndarray,
                      scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Re-answer exactly the queries that found fewer allowed rows than exist (up to
        ``width``)."""
        want = min(width, int(allowed.sum()))
        starved = np.flatnonzero((rows >= 0).sum(axis=1) < want)
        if starved.size == 0:
            return scores, rows
        try:
            exact = self._exact_search(array[starved], width, allowed)
        except RuntimeError:  # an index that cannot reconstruct: rank all of it instead
            exact = self._widening_search(array[starved], width, allowed)
        scores, rows = scores.copy(), rows.copy()
        scores[starved], rows[starved] = exact
        return scores, rows

    def _exact_search(self, array: np.ndarray, width: int, allowed: np.ndarray,
                      chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
        """Top-``width`` of the allowed rows, scored on their reconstructed vectors in chunks
        (memory stays (B, chunk)); same score convention as :meth:`_raw_search`."""
        candidates = np.flatnonzero(allowed)
        num_queries = array.shape[0]
        worst = -np.inf if self.metric == "ip" else np.inf
        best_scores = np.full((num_queries, 0), worst, dtype=np.float32)
        best_rows = np.full((num_queries, 0), -1, dtype=np.int64)
        for start in range(0, candidates.size, chunk):
            part = candidates[start:start + chunk]
            vectors = self.index.reconstruct_batch(self._row_labels[part])  # (c, D)
            dots = array @ vectors.T  # (B, c)
            if self.metric == "l2":
                part_scores = ((array * array).sum(1, keepdims=True) - 2 * dots
                               + (vectors * vectors).sum(1)[None, :])  # (B, c)
            else:
                part_scores = dots if self.metric == "ip" else 1.0 - dots
            merged_scores = np.concatenate([best_scores, part_scores.astype(np.float32)], 1)
            merged_rows = np.concatenate([best_rows, np.broadcast_to(part, dots.shape)], 1)
            order = np.argsort(-merged_scores if self.metric == "ip" else merged_scores,
                               axis=1, kind="stable")[:, :width]  # (B, width)
            best_scores = np.take_along_axis(merged_scores, order, 1)
            best_rows = np.take_along_axis(merged_rows, order, 1)
        out_scores = np.full((num_queries, width), worst, dtype=np.float32)
        out_rows = np.full((num_queries, width), -1, dtype=np.int64)
        out_scores[:, :best_rows.shape[1]] = best_scores
        out_rows[:, :best_rows.shape[1]] = best_rows
        return out_scores, out_rows

    def _selector_params(self, allowed: np.ndarray) -> Any:
        faiss = import_faiss()
        selector = faiss.IDSelectorBatch(self._row_labels[allowed].astype(np.int64))
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            return faiss.SearchParametersIVF(sel=selector, nprobe=ivf.nprobe)
        return faiss.SearchParameters(sel=selector)

    def _raw_search(self, array: np.ndarray, width: int,
                    params: Any) -> tuple[np.ndarray, np.ndarray]:
        """faiss search, labels mapped to rows (-1 when absent), scores in our convention."""
        distances, labels = self.index.search(array, width, params=params)
        table = self._label_to_row
        rows = np.full(labels.shape, -1, dtype=np.int64)
        known = (labels >= 0) & (labels < table.size)
        rows[known] = table[labels[known]]
        scores = distances.astype(np.float32)
        if self.metric == "cosine":
            scores = 1.0 - scores
        worst = -np.inf if self.metric == "ip" else np.inf
        return np.where(rows >= 0, scores, worst).astype(np.float32), rows

    def _widening_search(self, array: np.ndarray, width: int,
                         allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = self.ntotal
        want = min(width, int(allowed.sum()))
        depth = min(total, max(4 * width, 64))
        while True:
            scores, rows = self._raw_search(array, depth, None)
            keep = (rows >= 0) & allowed[np.maximum(rows, 0)]
            if depth >= total or int(keep.sum(axis=1).min()) >= want:
                break
            depth = min(total, depth * 4)
        worst = -np.inf if self.metric == "ip" else np.inf
        out_scores = np.full((array.shape[0], width), worst, dtype=np.float32)
        out_rows = np.full((array.shape[0], width), -1, dtype=np.int64)
        for i in range(array.shape[0]):
            picked = np.flatnonzero(keep[i])[:width]
            out_scores[i, : picked.size] = scores[i, picked]
            out_rows[i, : picked.size] = rows[i, picked]
        return out_scores, out_rows
