"""Metadata filters, compiled to one boolean row mask on the device before top-k.

A filter is either a callable ``metadata -> bool`` or a dict in the ``langchain_community``
FAISS dialect::

    {"source": "a.md"}                          # equality
    {"page": [1, 2, 3]}                         # a plain list means "$in"
    {"year": {"$gte": 2020, "$lt": 2024}}       # operators on one field are AND-ed
    {"$or": [{"lang": "en"}, {"$not": {"draft": True}}]}

Operators: ``$eq $ne $neq $gt $gte $lt $lte $in $nin`` on a field, ``$and $or $not`` to
combine. Top-level entries are AND-ed (``langchain_community`` silently ignores the other keys
when ``$and``/``$or``/``$not`` is present; we do not). A missing field reads as ``None``.

Semantics follow Python's operators on the stored values (``1 == 1.0 == True``), with one
difference from ``langchain_community``: an ordering comparison (``$gt``...) between values
Python cannot order (``None > 3``, ``"a" > 3``) is False for that row instead of raising
``TypeError`` in the middle of a search.

Evaluation: :func:`parse_filter` validates the whole filter up front (an unknown operator is
an :class:`~langchain_ascend.errors.InvalidFilterError` before anything runs).
:class:`MetadataColumns` encodes each field that a filter touches once per store version:
hashable values become integer codes (equality, ``$in``), numbers a float64 column, strings a
rank column (ordering), all as device tensors, so a leaf is one vectorised comparison. Values
these encodings cannot represent exactly (unhashable values, integers beyond 2**53, ordering
on dates...) fall back to a Python loop over that column, with the same semantics.
"""

from __future__ import annotations

import bisect
import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_ascend.errors import InvalidFilterError

if TYPE_CHECKING:
    import torch

FilterSpec = Mapping[str, Any] | Callable[[Mapping[str, Any]], bool]

ORDERING_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
FIELD_OPS = frozenset({"$eq", "$ne", "$neq", "$in", "$nin", *ORDERING_OPS})
LOGICAL_OPS = frozenset({"$and", "$or", "$not"})
_EXACT_INT_LIMIT = 2**53


@dataclass(frozen=True)
class Leaf:
    """One comparison ``metadata[field] <op> value``."""

    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class And:
    """All children hold (true when empty)."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    """At least one child holds (false when empty)."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    """The child does not hold."""

    child: Node


@dataclass(frozen=True)
class Predicate:
    """A user callable over the metadata dict."""

    fn: Callable[[Mapping[str, Any]], Any]


Node = Leaf | And | Or | Not | Predicate


def parse_filter(spec: FilterSpec) -> Node:
    """Validate a filter and turn it into a tree of nodes.

    Args:
        spec: A callable ``metadata -> bool`` or a filter dict (see the module docstring).

    Returns:
        The root node.

    Raises:
        InvalidFilterError: Unknown operator, wrong operand type, or neither dict nor callable.
    """
    if callable(spec) and not isinstance(spec, Mapping):
        return Predicate(spec)
    if not isinstance(spec, Mapping):
        raise InvalidFilterError(
            f"filter must be a dict of metadata conditions or a callable, not {type(spec).__name__}")
    return _parse_dict(spec, path="filter")


def _parse_dict(spec: Mapping[str, Any], path: str) -> Node:
    children: list[Node] = []
    for key, cond in spec.items():
        if not isinstance(key, str):
            raise InvalidFilterError(f"{path}: field names must be strings, got {key!r}")
        if key.startswith("$"):
            children.append(_parse_logical(key, cond, path))
        else:
            children.append(_parse_field(key, cond, f"{path}[{key!r}]"))
    return children[0] if len(children) == 1 else And(tuple(children))


def _parse_logical(op: str, operand: Any, path: str) -> Node:
    if op not in LOGICAL_OPS:
        known = ", ".join(sorted(LOGICAL_OPS | FIELD_OPS))
        raise InvalidFilterError(f"{path}: unsupported operator {op!r} (known: {known})")
    if op == "$not":
        if not isinstance(operand, Mapping):
            raise InvalidFilterError(f"{path}: '$not' takes a filter dict, got {operand!r}")
        return Not(_parse_dict(operand, f"{path}.$not"))
    if not isinstance(operand, (list, tuple)):
        raise InvalidFilterError(f"{path}: {op!r} takes a list of filter dicts, got {operand!r}")
    parsed = []
    for i, sub in enumerate(operand):
        if not isinstance(sub, Mapping):
            raise InvalidFilterError(f"{path}.{op}[{i}]: expected a filter dict, got {sub!r}")
        parsed.append(_parse_dict(sub, f"{path}.{op}[{i}]"))
    return And(tuple(parsed)) if op == "$and" else Or(tuple(parsed))


def _parse_field(name: str, cond: Any, path: str) -> Node:
    if isinstance(cond, Mapping):
        leaves: list[Node] = []
        for op, value in cond.items():
            if op not in FIELD_OPS:
                known = ", ".join(sorted(FIELD_OPS))
                raise InvalidFilterError(f"{path}: unsupported operator {op!r} (known: {known})")
            if op in ("$in", "$nin"):
                value = _as_collection(value, f"{path}.{op}")
            leaves.append(Leaf(name, op, value))
        return leaves[0] if len(leaves) == 1 else And(tuple(leaves))
    if isinstance(cond, list):
        return Leaf(name, "$in", tuple(cond))
    return Leaf(name, "$eq", cond)


def _as_collection(value: Any, path: str) -> tuple[Any, ...]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    raise InvalidFilterError(f"{path}: expects a list of values, got {value!r}")


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare(op: str, doc_value: Any, value: Any) -> bool:
    """Reference semantics of one leaf on one row (also the Python fallback path)."""
    try:
        if op == "$eq":
            return bool(doc_value == value)
        if op in ("$ne", "$neq"):
            return bool(doc_value != value)
        if op == "$in":
            return any(doc_value == v for v in value)
        if op == "$nin":
            return not any(doc_value == v for v in value)
        return bool(ORDERING_OPS[op](doc_value, value))
    except (TypeError, ValueError):
        return False


def matches(node: Node, metadata: Mapping[str, Any]) -> bool:
    """Evaluate a parsed filter on one metadata dict (pure Python reference)."""
    if isinstance(node, Leaf):
        return compare(node.op, metadata.get(node.field), node.value)
    if isinstance(node, And):
        return all(matches(child, metadata) for child in node.children)
    if isinstance(node, Or):
        return any(matches(child, metadata) for child in node.children)
    if isinstance(node, Not):
        return not matches(node.child, metadata)
    return bool(node.fn(metadata))


def _is_real_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, complex)


@dataclass
class Column:
    """One metadata field over all rows, encoded for vectorised comparisons.

    Attributes:
        values: The raw values in row order (``None`` where the field is missing).
        device: Where the encoded tensors live.
    """

    values: list[Any]
    device: Any
    _codes: Any = None
    _code_of: dict[Any, int] | None = None
    _hashable: bool | None = None
    _numbers: Any = None
    _numbers_exact: bool | None = None
    _ranks: Any = None
    _sorted_strings: list[str] = field(default_factory=list)

    def _torch(self) -> Any:
        import torch

        return torch

    def codes(self) -> tuple[Any, dict[Any, int]] | None:
        """``(codes (N,) int64, value -> code)``, or None when some value is unhashable.

        Equal values (by ``==``, which dict lookup uses) share a code; NaN gets -1 (never
        equal to anything, as in Python).
        """
        if self._hashable is None:
            code_of: dict[Any, int] = {}
            out: list[int] = []
            try:
                for value in self.values:
                    if _is_nan(value):
                        out.append(-1)
                        continue
                    out.append(code_of.setdefault(value, len(code_of)))
            except TypeError:
                self._hashable = False
                return None
            self._hashable = True
            self._code_of = code_of
            self._codes = self._torch().tensor(out, dtype=self._torch().int64, device=self.device)
        if not self._hashable:
            return None
        assert self._code_of is not None
        return self._codes, self._code_of

    def numbers(self) -> Any | None:
        """(N,) float64 with NaN for rows that are not real numbers; None if not exact."""
        if self._numbers_exact is None:
            exact = True
            out: list[float] = []
            for value in self.values:
                if _is_real_number(value):
                    if isinstance(value, numbers.Integral) and abs(int(value)) > _EXACT_INT_LIMIT:
                        exact = False
                        break
                    out.append(float(value))
                else:
                    out.append(math.nan)
            self._numbers_exact = exact
            if exact:
                torch = self._torch()
                self._numbers = torch.tensor(out, dtype=torch.float64, device=self.device)
        return self._numbers if self._numbers_exact else None

    def string_ranks(self) -> tuple[Any, list[str]]:
        """``(ranks (N,) int64, sorted distinct strings)``; rank -1 for non-string rows."""
        if self._ranks is None:
            strings = sorted({v for v in self.values if isinstance(v, str)})
            rank_of = {s: i for i, s in enumerate(strings)}
            out = [rank_of[v] if isinstance(v, str) else -1 for v in self.values]
            torch = self._torch()
            self._ranks = torch.tensor(out, dtype=torch.int64, device=self.device)
            self._sorted_strings = strings
        return self._ranks, self._sorted_strings


class MetadataColumns:
    """Lazily encoded metadata columns for one snapshot of a store's rows.

    Args:
        metadatas: The metadata dict of each row, in row order. Must not change while this
            object is in use; the store builds a new one after every write.
        device: Device of the masks it produces.
    """

    def __init__(self, metadatas: Sequence[Mapping[str, Any]], device: Any) -> None:
        self._metadatas = metadatas
        self._device = device
        self._columns: dict[str, Column] = {}

    def __len__(self) -> int:
        return len(self._metadatas)

    def row_is_current(self, row: int, metadata: Mapping[str, Any]) -> bool:
        """Whether ``metadata`` is still the dict of ``row`` and holds the values the columns
        built so far encoded for it (same type, equal)."""
        if self._metadatas[row] is not metadata:
            return False
        for name, col in self._columns.items():
            cached, now = col.values[row], metadata.get(name)
            if cached is not now and not (type(cached) is type(now) and _equal(cached, now)):
                return False
        return True

    def column(self, name: str) -> Column:
        """The encoded column of one field (built on first use)."""
        col = self._columns.get(name)
        if col is None:
            col = Column([m.get(name) for m in self._metadatas], self._device)
            self._columns[name] = col
        return col

    def mask(self, node: Node) -> torch.Tensor:
        """Boolean (N,) device mask of the rows that satisfy ``node``."""
        torch = _torch()
        if isinstance(node, Leaf):
            return _leaf_mask(self.column(node.field), node, self._device)
        if isinstance(node, And):
            out = torch.ones(len(self), dtype=torch.bool, device=self._device)
            for child in node.children:
                out &= self.mask(child)
            return out
        if isinstance(node, Or):
            out = torch.zeros(len(self), dtype=torch.bool, device=self._device)
            for child in node.children:
                out |= self.mask(child)
            return out
        if isinstance(node, Not):
            return ~self.mask(node.child)
        flags = [bool(node.fn(m)) for m in self._metadatas]
        return torch.tensor(flags, dtype=torch.bool, device=self._device)


def _torch() -> Any:
    import torch

    return torch


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. numpy arrays: no single truth value
        return False


def _leaf_mask(col: Column, leaf: Leaf, device: Any) -> torch.Tensor:
    """One vectorised comparison, or the Python fallback when no encoding is exact."""
    torch = _torch()
    op, value = leaf.op, leaf.value
    fast = None
    if op in ("$eq", "$ne", "$neq"):
        fast = _equality_mask(col, (value,))
        if fast is not None and op != "$eq":
            fast = ~fast
    elif op in ("$in", "$nin"):
        fast = _equality_mask(col, value)
        if fast is not None and op == "$nin":
            fast = ~fast
    else:
        fast = _ordering_mask(col, op, value)
    if fast is not None:
        return fast
    flags = [compare(op, v, value) for v in col.values]
    return torch.tensor(flags, dtype=torch.bool, device=device)


def _equality_mask(col: Column, values: Sequence[Any]) -> torch.Tensor | None:
    """Rows equal to any of ``values`` via integer codes; None when codes cannot decide."""
    torch = _torch()
    encoded = col.codes()
    if encoded is None:
        return None
    codes, code_of = encoded
    wanted: list[int] = []
    for value in values:
        try:
            code = code_of.get(value)
        except TypeError:
            return None
        if code is not None:
            wanted.append(code)
    if not wanted:
        return torch.zeros(codes.shape[0], dtype=torch.bool, device=codes.device)
    return torch.isin(codes, torch.tensor(wanted, dtype=torch.int64, device=codes.device))


def _ordering_mask(col: Column, op: str, value: Any) -> torch.Tensor | None:
    """``$gt``-style comparison on the number or string encoding; None to fall back."""
    if _is_real_number(value):
        if isinstance(value, numbers.Integral) and abs(int(value)) > _EXACT_INT_LIMIT:
            return None
        nums = col.numbers()
        if nums is None:
            return None
        result: Any = ORDERING_OPS[op](nums, float(value))  # (N,) bool tensor
        return result
    if isinstance(value, str):
        ranks, strings = col.string_ranks()
        is_str = ranks >= 0
        if op == "$gt":
            return ranks >= bisect.bisect_right(strings, value)
        if op == "$gte":
            return ranks >= bisect.bisect_left(strings, value)
        if op == "$lt":
            return is_str & (ranks < bisect.bisect_left(strings, value))
        return is_str & (ranks < bisect.bisect_right(strings, value))
    return None
