"""Documents and the row <-> id bookkeeping of a vector store."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping

from langchain_core.documents import Document


class DocumentStore:
    """Documents by id, readable like ``langchain_community``'s ``InMemoryDocstore``.

    ``search(id)`` returns the document, or the string ``"ID <id> not found."`` as
    ``InMemoryDocstore`` does. Add and delete documents through the vector store, not here:
    the store keeps the vectors and rows in step with this mapping.

    Args:
        documents: The store's documents by id.
        hand_out: Gives the stored document of an id to a caller (the store notes it: a
            caller may change its metadata); None reads ``documents`` directly.
    """

    def __init__(self, documents: dict[str, Document],
                 hand_out: Callable[[str], Document | None] | None = None) -> None:
        self._dict = documents
        self._hand_out = hand_out

    def search(self, search: str) -> Document | str:
        """The document with id ``search``, or a not-found message."""
        doc = self._dict.get(search) if self._hand_out is None else self._hand_out(search)
        return doc if doc is not None else f"ID {search} not found."

    def __len__(self) -> int:
        return len(self._dict)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._dict


class RowIdView(Mapping[int, str]):
    """Read-only ``{row: id}`` view (lc FAISS's ``index_to_docstore_id``), always current."""

    def __init__(self, row_ids: Callable[[], list[str]]) -> None:
        self._row_ids = row_ids

    def __getitem__(self, row: int) -> str:
        ids = self._row_ids()
        try:
            position = operator.index(row)
        except TypeError:
            raise KeyError(row) from None
        if not 0 <= position < len(ids):
            raise KeyError(row)
        return ids[position]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._row_ids())))

    def __len__(self) -> int:
        return len(self._row_ids())

    def __repr__(self) -> str:
        return f"RowIdView({dict(self)!r})"
