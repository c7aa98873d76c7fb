"""Helpers shared by the vector store and index tests (tests/vectorstores, tests/index); imported
by file name: tests/conftest.py puts this folder on ``sys.path``."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import numpy as np
from langchain_core.embeddings import Embeddings


def lc_module(name: str) -> ModuleType:
    """Import a langchain_community module without its sunset DeprecationWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


class TableEmbeddings(Embeddings):
    """Embeddings looked up in a fixed text -> vector table (random vectors for new texts).

    Lets a test give both our store and lc FAISS exactly the same vectors.
    """

    def __init__(self, dim: int = 16, seed: int = 0) -> None:
        self.dim = dim
        self.table: dict[str, list[float]] = {}
        self._rng = np.random.default_rng(seed)
        self.document_calls = 0

    def vector(self, text: str) -> list[float]:
        if text not in self.table:
            self.table[text] = self._rng.normal(size=self.dim).astype(np.float32).tolist()
        return self.table[text]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.document_calls += 1
        return [self.vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.vector(text)
