"""How a vector store calls its embedding model.

The tensor methods of :class:`~langchain_ascend.embeddings.AscendEmbeddings` come first (the
vectors stay on the device, no Python lists), then the LangChain ``Embeddings`` methods, then
a plain ``text -> vector`` callable (as lc FAISS accepts).
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor

from langchain_ascend.errors import VectorStoreInputError


def _require(emb: Any) -> Any:
    if emb is None:
        raise VectorStoreInputError(
            "this store has no embedding model: pass embedding=... or use the *_by_vector "
            "methods")
    return emb


def documents(emb: Any, texts: list[str]) -> Any:
    """Vectors of documents (a tensor or lists of floats)."""
    emb = _require(emb)
    if hasattr(emb, "embed_documents_tensor"):
        return emb.embed_documents_tensor(texts)
    if isinstance(emb, Embeddings):
        return emb.embed_documents(texts)
    return [emb(text) for text in texts]


async def adocuments(emb: Any, texts: list[str]) -> Any:
    """Async :func:`documents` (a plain callable runs in an executor)."""
    emb = _require(emb)
    if hasattr(emb, "aembed_documents_tensor"):
        return await emb.aembed_documents_tensor(texts)
    if isinstance(emb, Embeddings):
        return await emb.aembed_documents(texts)
    return await run_in_executor(None, lambda: [emb(text) for text in texts])


def queries(emb: Any, texts: list[str]) -> Any:
    """Vectors of queries (a tensor or lists of floats)."""
    emb = _require(emb)
    if hasattr(emb, "embed_queries_tensor"):
        return emb.embed_queries_tensor(texts)
    if isinstance(emb, Embeddings):
        return [emb.embed_query(q) for q in texts]
    return [emb(q) for q in texts]


async def aqueries(emb: Any, texts: list[str]) -> Any:
    """Async :func:`queries` (a plain callable runs in an executor)."""
    emb = _require(emb)
    if hasattr(emb, "aembed_queries_tensor"):
        return await emb.aembed_queries_tensor(texts)
    if isinstance(emb, Embeddings):
        return [await emb.aembed_query(q) for q in texts]
    return await run_in_executor(None, queries, emb, texts)
