"""The agent's pieces inside langchain's ``create_agent`` and a langgraph ``StateGraph``: the
retriever tool as one of create_agent's tools, AscendAgent as a graph node, and a graph whose
tools node is NPUStreamToolExecutor running the retriever tool. (The executor as the tools
node of a plain loop is tests/tools/test_executor_graph.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from agent_test_helpers import call, scripted
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from vectorstore_test_helpers import TableEmbeddings

from langchain_ascend import AscendFAISS, NPUStreamToolExecutor, create_ascend_agent
from langchain_ascend.agent import retriever_tool

TEXTS = ["the KV cache is paged", "tools run in parallel on streams"]


@tool
def weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def search() -> Any:
    store = AscendFAISS.from_texts(TEXTS, TableEmbeddings(dim=8, seed=2), device="cpu")
    return retriever_tool(store.as_retriever(search_kwargs={"k": 1}))


def test_retriever_tool_in_langchain_create_agent(search) -> None:
    from langchain.agents import create_agent

    model = scripted(AIMessage("", tool_calls=[call("search_docs", "s1", query=TEXTS[1]),
                                               call("weather", "w1", city="Oslo")]),
                     AIMessage("Tools run in parallel; Oslo is sunny."))
    agent = create_agent(model, tools=[search, weather])
    messages = agent.invoke({"messages": [HumanMessage("q")]})["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [TEXTS[1], "sunny in Oslo"]
    assert model.calls[0]["kwargs"]["bound_tools"] == ["search_docs", "weather"]
    assert messages[-1].content.startswith("Tools run in parallel")


def test_state_graph_with_the_executor_running_the_retriever_tool(search) -> None:
    model = scripted(AIMessage("", tool_calls=[call("search_docs", "s1", query=TEXTS[0])]),
                     AIMessage("It is paged."))
    bound = model.bind_tools([search])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", NPUStreamToolExecutor([search]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    messages = graph.compile().invoke({"messages": [HumanMessage("q")]})["messages"]
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert messages[2].content == TEXTS[0]


async def test_ascend_agent_as_a_node_of_a_state_graph(search) -> None:
    model = scripted(AIMessage("", tool_calls=[call("search_docs", "s1", query=TEXTS[0])]),
                     AIMessage("It is paged."),
                     AIMessage("", tool_calls=[call("weather", "w1", city="Rome")]),
                     AIMessage("Rome is sunny."))
    agent = create_ascend_agent(model, [weather], retriever=search.retriever)

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    app = graph.compile()
    first = await app.ainvoke({"messages": [HumanMessage("Is the cache paged?")]})
    # the agent's output holds the input messages too: add_messages keeps one copy of each
    assert [type(m).__name__ for m in first["messages"]] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    second = app.invoke({"messages": [*first["messages"], HumanMessage("Weather in Rome?")]})
    assert [m.content for m in second["messages"][-3:]] == [
        "", "sunny in Rome", "Rome is sunny."]
    assert len(second["messages"]) == 8
