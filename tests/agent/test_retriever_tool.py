"""The retriever tool (``retriever=`` of create_ascend_agent) over a tiny AscendFAISS."""

from __future__ import annotations

from typing import Any

import pytest
from agent_test_helpers import call, scripted
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, ToolMessage
from vectorstore_test_helpers import TableEmbeddings

from langchain_ascend import AscendFAISS, NPUStreamToolExecutor, create_ascend_agent
from langchain_ascend.agent import retriever_tool
from langchain_ascend.agent.retriever_tool import NO_MATCH
from langchain_ascend.errors import InvalidArgumentTypeError

TEXTS = ["prefix caching reuses the KV cache", "paged attention splits the cache in blocks",
         "Beijing is cold in winter"]


@pytest.fixture(scope="module")
def store() -> AscendFAISS:
    return AscendFAISS.from_texts(TEXTS, TableEmbeddings(dim=8, seed=1),
                                  metadatas=[{"n": i} for i in range(3)],
                                  ids=["d0", "d1", "d2"], device="cpu")


def test_tool_returns_the_joined_page_contents(store) -> None:
    search = retriever_tool(store.as_retriever(search_kwargs={"k": 2}))
    assert search.name == "search_docs" and "query" in search.args
    text = search.invoke({"query": TEXTS[1]})
    first, second = text.split("\n\n")
    assert first == TEXTS[1] and second in TEXTS  # nearest first
    cited = retriever_tool(store, with_ids=True, document_separator=" | ", name="kb")
    assert cited.name == "kb"
    assert cited.invoke({"query": TEXTS[2]}).startswith(f"[d2] {TEXTS[2]} | [")
    nothing = retriever_tool(store.as_retriever(search_kwargs={"filter": {"n": 99}}))
    assert nothing.invoke({"query": "x"}) == NO_MATCH
    with pytest.raises(InvalidArgumentTypeError, match="retriever must be"):
        retriever_tool("not a retriever")


async def test_async_tool_and_retrieval_is_a_child_run(store) -> None:
    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tool_run: Any = None
            self.retriever_parent: Any = None

        def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                          **kwargs: Any) -> None:
            self.tool_run = run_id

        def on_retriever_start(self, serialized: Any, query: str, *, run_id: Any,
                               parent_run_id: Any = None, **kwargs: Any) -> None:
            self.retriever_parent = parent_run_id

    search = retriever_tool(store.as_retriever(search_kwargs={"k": 1}))
    seen = Seen()
    assert await search.ainvoke({"query": TEXTS[0]}, {"callbacks": [seen]}) == TEXTS[0]
    assert seen.tool_run is not None and seen.retriever_parent == seen.tool_run


def test_the_agent_offers_and_runs_the_retriever_tool(store) -> None:
    model = scripted(AIMessage("", tool_calls=[call("search_docs", "s1", query=TEXTS[2])]),
                     AIMessage("It is cold."))
    agent = create_ascend_agent(model, [], retriever=store.as_retriever(search_kwargs={"k": 1}))
    out = agent.invoke("Is Beijing cold?")
    assert model.calls[0]["kwargs"]["bound_tools"] == ["search_docs"]
    result = out["messages"][2]
    assert isinstance(result, ToolMessage) and result.content == TEXTS[2]
    assert model.calls[1]["messages"][2].content == TEXTS[2]


def test_a_custom_executor_needs_the_retriever_tool_too(store) -> None:
    with pytest.raises(ValueError, match="search_docs"):
        create_ascend_agent(scripted(), [], retriever=store, executor=NPUStreamToolExecutor([]))
    search = retriever_tool(store, name="kb")
    executor = NPUStreamToolExecutor([search], timeout_ms=2000)
    model = scripted(AIMessage("", tool_calls=[call("kb", "k1", query=TEXTS[0])]),
                     AIMessage("ok"))
    out = create_ascend_agent(model, [search], executor=executor).invoke("q")
    assert TEXTS[0] in out["messages"][2].content
