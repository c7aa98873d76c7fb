"""Distance strategies (the same string values as ``langchain_community``) and index metrics."""

from __future__ import annotations

from enum import Enum
from typing import Any

from langchain_ascend.errors import VectorStoreInputError


class DistanceStrategy(str, Enum):
    """How vectors are compared; values equal ``langchain_community``'s ``DistanceStrategy``.

    A ``langchain_community`` member (or its string value) is accepted wherever this one is.

    * ``EUCLIDEAN_DISTANCE``: squared L2 distance (what faiss ``IndexFlatL2`` returns);
      lower is better.
    * ``MAX_INNER_PRODUCT`` / ``DOT_PRODUCT``: inner product; higher is better.
    * ``COSINE``: cosine distance ``1 - cos``; lower is better (a real cosine).
    * ``JACCARD``: not supported by this store.
    """

    EUCLIDEAN_DISTANCE = "EUCLIDEAN_DISTANCE"
    MAX_INNER_PRODUCT = "MAX_INNER_PRODUCT"
    DOT_PRODUCT = "DOT_PRODUCT"
    JACCARD = "JACCARD"
    COSINE = "COSINE"


_METRIC_OF = {
    DistanceStrategy.EUCLIDEAN_DISTANCE: "l2",
    DistanceStrategy.MAX_INNER_PRODUCT: "ip",
    DistanceStrategy.DOT_PRODUCT: "ip",
    DistanceStrategy.COSINE: "cosine",
}


def as_strategy(value: Any) -> DistanceStrategy:
    """Our member for a strategy given as our enum, lc's enum or its string value.

    Raises:
        VectorStoreInputError: Unknown or unsupported strategy.
    """
    raw = value.value if isinstance(value, Enum) else value
    try:
        strategy = DistanceStrategy(str(raw).upper())
    except ValueError:
        known = ", ".join(s.value for s in _METRIC_OF)
        raise VectorStoreInputError(
            f"unknown distance_strategy {value!r}: use one of {known}") from None
    if strategy not in _METRIC_OF:
        raise VectorStoreInputError(f"distance_strategy {strategy.value} is not supported here")
    return strategy


def metric_of_strategy(strategy: DistanceStrategy) -> str:
    """Index metric (``"l2"``, ``"ip"``, ``"cosine"``) for a strategy."""
    return _METRIC_OF[strategy]
