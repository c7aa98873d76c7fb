"""Metadata filters: parsing, the Python reference semantics, and the vectorised device mask."""

from __future__ import annotations

import datetime as dt
import random

import pytest
import torch

from langchain_ascend.errors import InvalidFilterError
from langchain_ascend.index.filters import MetadataColumns, matches, parse_filter

ROWS = [
    {"n": 1, "s": "apple", "f": 1.5, "b": True, "tags": ["x"]},
    {"n": 2, "s": "banana", "f": 2.5, "b": False},
    {"n": 3, "s": "cherry", "f": float("nan"), "tags": ["y", "z"]},
    {"n": 4.0, "s": "apple", "b": True, "d": dt.date(2024, 5, 1)},
    {"n": None, "s": 7, "d": dt.date(2023, 1, 1)},
    {"n": 2**60, "s": "date", "f": -1},
    {},
]


def mask_of(spec, rows=ROWS) -> list[bool]:
    return MetadataColumns(rows, torch.device("cpu")).mask(parse_filter(spec)).tolist()


def reference(spec, rows=ROWS) -> list[bool]:
    node = parse_filter(spec)
    return [matches(node, row) for row in rows]


@pytest.mark.parametrize("spec, expected", [
    ({"s": "apple"}, [True, False, False, True, False, False, False]),
    ({"n": 4}, [False, False, False, True, False, False, False]),  # 4 == 4.0
    ({"b": 1}, [True, False, False, True, False, False, False]),  # True == 1 as in Python
    ({"n": [1, 3]}, [True, False, True, False, False, False, False]),  # a list means $in
    ({"n": {"$gt": 2}}, [False, False, True, True, False, True, False]),
    ({"n": {"$gte": 2, "$lt": 4}}, [False, True, True, False, False, False, False]),
    ({"s": {"$gt": "banana"}}, [False, False, True, False, False, True, False]),  # 7 not a str
    ({"s": {"$lte": "apple"}}, [True, False, False, True, False, False, False]),
    ({"n": {"$ne": 2}}, [True, False, True, True, True, True, True]),  # missing matches $ne
    ({"n": {"$neq": 2}}, [True, False, True, True, True, True, True]),
    ({"n": {"$nin": [1, 2]}}, [False, False, True, True, True, True, True]),
    ({"n": None}, [False, False, False, False, True, False, True]),  # missing reads as None
    ({"f": {"$eq": float("nan")}}, [False] * 7),  # NaN equals nothing
    ({"f": {"$lt": 0}}, [False, False, False, False, False, True, False]),
    ({"n": {"$gt": 2**59}}, [False, False, False, False, False, True, False]),  # > 2**53
    ({"tags": {"$eq": ["y", "z"]}}, [False, False, True, False, False, False, False]),
    ({"d": {"$gte": dt.date(2024, 1, 1)}}, [False, False, False, True, False, False, False]),
    ({"$or": [{"s": "banana"}, {"n": 3}]}, [False, True, True, False, False, False, False]),
    ({"$and": [{"s": "apple"}, {"b": True}]}, [True, False, False, True, False, False, False]),
    ({"$not": {"s": "apple"}}, [False, True, True, False, True, True, True]),
    ({"$or": []}, [False] * 7),
    ({}, [True] * 7),
    ({"s": "apple", "$not": {"n": 1}}, [False, False, False, True, False, False, False]),
])
def test_mask_matches_expected_and_reference(spec, expected) -> None:
    assert reference(spec) == expected
    assert mask_of(spec) == expected


def test_callable_filter_runs_on_each_metadata() -> None:
    def is_apple(meta):
        return meta.get("s") == "apple"

    assert mask_of(is_apple) == [m.get("s") == "apple" for m in ROWS]


def test_random_filters_agree_with_reference() -> None:
    rng = random.Random(7)
    values = [0, 1, 2, 2.5, True, False, None, "a", "b", "c", -3]
    rows = [{"x": rng.choice(values), "y": rng.choice(values)} for _ in range(200)]
    ops = ["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]
    for _ in range(150):
        field, op = rng.choice(["x", "y"]), rng.choice(ops + ["$in", "$nin"])
        operand = rng.sample(values, 3) if op in ("$in", "$nin") else rng.choice(values)
        spec = {field: {op: operand}}
        if rng.random() < 0.3:
            spec = {"$or": [spec, {"y": rng.choice(values)}]}
        assert mask_of(spec, rows) == reference(spec, rows), spec


@pytest.mark.parametrize("spec, words", [
    ({"n": {"$regex": "a"}}, "$regex"),
    ({"$xor": [{"n": 1}]}, "$xor"),
    ({"$and": {"n": 1}}, "list"),
    ({"$or": [1, 2]}, "filter dict"),
    ({"$not": [{"n": 1}]}, "$not"),
    ({"n": {"$in": "abc"}}, "list of values"),
    ("n == 1", "dict"),
    ({1: "x"}, "strings"),
])
def test_bad_filters_raise_typed_errors(spec, words) -> None:
    with pytest.raises(InvalidFilterError, match=words.replace("$", r"\$")):
        parse_filter(spec)
    assert issubclass(InvalidFilterError, ValueError)
