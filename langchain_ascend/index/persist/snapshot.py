"""A store's rows and index as a :class:`~.folder.SavedIndex`, and back.

:func:`snapshot` gathers what a save writes; :func:`options_from_config` and
:func:`restore_state` rebuild a store from what a save holds (its options, its index, its rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from langchain_core.documents import Document

from langchain_ascend.errors import IndexFormatError, VectorStoreInputError
from langchain_ascend.index.distance import as_strategy
from langchain_ascend.index.faiss_io import FaissIndex, import_faiss
from langchain_ascend.index.ivf import IVFIndex
from langchain_ascend.index.persist.faiss_files import write_index_bytes
from langchain_ascend.index.persist.folder import SavedIndex
from langchain_ascend.index.store_state import IndexOptions, StoreState

if TYPE_CHECKING:
    import torch


def snapshot(index: Any, documents: Sequence[Document], config: dict[str, Any]) -> SavedIndex:
    """Everything to save for ``index`` whose rows hold ``documents`` (in row order)."""
    import torch

    rows = [{"id": d.id, "page_content": d.page_content, "metadata": d.metadata}
            for d in documents]
    tensors: dict[str, torch.Tensor] = {}
    faiss_bytes = None
    if isinstance(index, FaissIndex):
        faiss_bytes = write_index_bytes(index.index)
        tensors["faiss_labels"] = torch.from_numpy(index.row_labels.copy())
    elif index is not None:
        tensors["vectors"] = index.vectors().contiguous()
        if isinstance(index, IVFIndex) and index.centroids is not None:
            assignments = index.assignments()
            assert assignments is not None
            tensors["centroids"] = index.centroids.clone()
            tensors["assignments"] = assignments.clone()
    return SavedIndex(config, rows, tensors, faiss_bytes)


def restore_index(saved: SavedIndex, new_index: Callable[[int], Any], *, metric: str,
                  device: Any, factory: str, count: int, dim: int, index_type: str) -> Any:
    """Rebuild the index of a save (``new_index(dim)`` makes an empty one of the right kind).

    Raises:
        IndexFormatError: Missing or mis-shaped parts.
    """
    if index_type == "faiss":
        if saved.faiss_bytes is None or "faiss_labels" not in saved.tensors:
            raise IndexFormatError("saved faiss index is missing index.faiss or its labels")
        faiss = import_faiss()
        try:
            raw = faiss.deserialize_index(np.frombuffer(saved.faiss_bytes, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexFormatError(f"index.faiss cannot be read: {exc}") from exc
        return FaissIndex(raw, metric, device=device,
                          row_labels=saved.tensors["faiss_labels"].cpu().numpy(), factory=factory)
    vectors = saved.tensors.get("vectors")
    if vectors is None or tuple(vectors.shape) != (count, dim):
        shape = None if vectors is None else tuple(vectors.shape)
        raise IndexFormatError(f"vectors have shape {shape}, expected {(count, dim)}")
    index = new_index(int(dim))
    index.add(vectors.to(device).float())
    if isinstance(index, IVFIndex) and "centroids" in saved.tensors:
        index.set_centroids(saved.tensors["centroids"], saved.tensors.get("assignments"))
    return index


def options_from_config(config: dict[str, Any],
                        kwargs: dict[str, Any]) -> tuple[dict[str, Any], int, Any]:
    """Constructor options of a saved store (``kwargs`` win), its vector count and dim.

    Raises:
        IndexFormatError: The config lacks a field.
        VectorStoreInputError: ``kwargs`` asks for another distance strategy.
    """
    try:
        strategy = as_strategy(config["distance_strategy"])
        options = {
            "normalize_L2": bool(config["normalize_L2"]),
            "distance_strategy": strategy,
            "index_type": config["index_type"],
            "dtype": config.get("dtype", "float32"),
            "nlist": config.get("nlist"),
            "nprobe": config.get("nprobe"),
            "faiss_factory": config.get("faiss_factory") or "Flat",
            "ivf_min_train_size": config.get("ivf_min_train_size"),
        }
        dim, count = config["dim"], int(config["num_vectors"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(f"saved index config is incomplete: {exc}") from exc
    if "distance_strategy" in kwargs and as_strategy(kwargs["distance_strategy"]) != strategy:
        raise VectorStoreInputError(
            f"the saved index uses {strategy.value}; it cannot be loaded as "
            f"{as_strategy(kwargs['distance_strategy']).value}")
    options.update(kwargs)
    return options, count, dim


def restore_state(saved: SavedIndex, state: StoreState, options: IndexOptions, *,
                  factory: str, count: int, dim: int) -> None:
    """Fill an empty ``state`` with the rows of a save holding ``count`` vectors.

    Raises:
        IndexFormatError: Counts, shapes or ids that do not add up.
    """
    if len(saved.documents) != count:
        raise IndexFormatError(
            f"docstore.json holds {len(saved.documents)} documents, expected {count}")
    if count == 0:
        return
    index = restore_index(saved, options.new_index, metric=options.metric,
                          device=options.device, factory=factory, count=count, dim=dim,
                          index_type=options.index_type)
    if index.ntotal != count:
        raise IndexFormatError(f"index holds {index.ntotal} vectors, expected {count}")
    ids = [row["id"] for row in saved.documents]
    if len(set(ids)) != len(ids):
        raise IndexFormatError("docstore.json repeats a document id")
    state.install(index, ids, {row["id"]: Document(
        id=row["id"], page_content=row["page_content"], metadata=row["metadata"])
        for row in saved.documents})
