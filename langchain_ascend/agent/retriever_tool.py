"""A retriever as an agent tool: ``query`` in, the matching passages joined into one text out.

Like ``langchain_core.tools.create_retriever_tool``, with two things a small local model
needs: an explicit text when nothing matched (an empty tool result reads as a failed call),
and optional ``[id]`` prefixes so an answer can cite its source.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.documents import Document
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field

from langchain_ascend.errors import InvalidArgumentTypeError

DEFAULT_NAME = "search_docs"
DEFAULT_DESCRIPTION = (
    "Search the document collection for passages about a topic and return the best matches. "
    "Use it for facts that the documents may hold."
)
NO_MATCH = "No matching documents were found."


class RetrieverInput(BaseModel):
    """The retriever tool's one argument."""

    query: str = Field(description="What to look for, in a few words.")


class RetrieverTool(BaseTool):
    """Runs ``retriever`` on the model's query; the retriever's run is a child of the tool's
    run, so callback handlers (traces, timelines) see the retrieval."""

    name: str = DEFAULT_NAME
    description: str = DEFAULT_DESCRIPTION
    args_schema: type[BaseModel] = RetrieverInput
    retriever: Any
    """A ``BaseRetriever`` or any Runnable from a query string to a list of Documents."""
    document_separator: str = "\n\n"
    with_ids: bool = False
    """Prefix each passage with ``[document id]`` (when the document has one)."""

    def format_documents(self, docs: list[Document]) -> str:
        """The tool's text for ``docs``: page contents joined by ``document_separator``."""
        if not docs:
            return NO_MATCH
        parts = []
        for doc in docs:
            text = doc.page_content
            if self.with_ids and doc.id:
                text = f"[{doc.id}] {text}"
            parts.append(text)
        return self.document_separator.join(parts)

    def _run(self, query: str, run_manager: CallbackManagerForToolRun | None = None) -> str:
        callbacks = run_manager.get_child() if run_manager else None
        return self.format_documents(self.retriever.invoke(query, {"callbacks": callbacks}))

    async def _arun(self, query: str,
                    run_manager: AsyncCallbackManagerForToolRun | None = None) -> str:
        callbacks = run_manager.get_child() if run_manager else None
        docs = await self.retriever.ainvoke(query, {"callbacks": callbacks})
        return self.format_documents(docs)


def retriever_tool(retriever: Any, *, name: str = DEFAULT_NAME, description: str | None = None,
                   document_separator: str = "\n\n", with_ids: bool = False) -> RetrieverTool:
    """A tool that searches ``retriever`` (``AscendFAISS.as_retriever()``, any retriever).

    Args:
        retriever: A retriever, any Runnable from a query to Documents, or a vector store
            (its ``as_retriever()`` is used).
        name: The tool's name as the model sees it.
        description: What the model is told the tool does (default: a generic search).
        document_separator: Put between passages.
        with_ids: Prefix each passage with ``[document id]``.

    Raises:
        InvalidArgumentTypeError: ``retriever`` is none of the above.

    Example:
        .. code-block:: python

            search = retriever_tool(store.as_retriever(search_kwargs={"k": 2}))
            search.invoke({"query": "prefix caching"})
            # -> 'Automatic prefix caching ...\\n\\n...'
    """
    if not isinstance(retriever, Runnable) and callable(getattr(retriever, "as_retriever", None)):
        retriever = retriever.as_retriever()
    if not isinstance(retriever, Runnable):
        raise InvalidArgumentTypeError(
            "retriever must be a retriever (e.g. AscendFAISS.as_retriever()), a Runnable "
            f"returning Documents, or a vector store; got {type(retriever).__name__}")
    return RetrieverTool(name=name, description=description or DEFAULT_DESCRIPTION,
                         retriever=retriever, document_separator=document_separator,
                         with_ids=with_ids)
