"""NPUStreamToolExecutor as the tools node of a langgraph agent loop and inside LCEL chains,
driven by a scripted chat model (no LLM).

langchain 1.x ``create_agent`` builds its own ToolNode from a list of tools and takes no custom
tool node, so the agent loop here is the one it builds, written out: a model node, this
executor as the tools node, and ``tools_condition`` between them.
"""

from __future__ import annotations

import inspect
import time
from typing import Annotated, Any, TypedDict

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime, tools_condition
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command, interrupt
from tool_test_helpers import ScriptedChatModel, tool_call

from langchain_ascend import NPUStreamToolExecutor


class AgentState(TypedDict):
    messages: Annotated[list, add_messages]
    user: str


@tool
def weather(city: str) -> str:
    """Weather of a city."""
    time.sleep(0.05)
    return f"sunny in {city}"


@tool
def population(city: str) -> int:
    """Population of a city."""
    return {"Paris": 2_100_000, "Rome": 2_800_000}[city]


def build_agent(model: ScriptedChatModel, executor: NPUStreamToolExecutor, **compile: Any) -> Any:
    bound = model.bind_tools(list(executor.tools_by_name.values()))

    def agent(state: AgentState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def aagent(state: AgentState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(AgentState)
    graph.add_node("agent", RunnableLambda(agent, afunc=aagent))
    graph.add_node("tools", executor)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(**compile)


def script() -> ScriptedChatModel:
    return ScriptedChatModel(responses=[
        AIMessage("", tool_calls=[tool_call("weather", "w1", city="Paris"),
                                  tool_call("population", "p1", city="Rome"),
                                  tool_call("unknown_tool", "u1")]),
        AIMessage("", tool_calls=[tool_call("weather", "w2", city="Rome")]),
        AIMessage("Paris is sunny; Rome has 2.8M people."),
    ])


def check_transcript(messages: list[Any]) -> None:
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "ToolMessage",
                     "AIMessage", "ToolMessage", "AIMessage"]
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == ["w1", "p1", "u1", "w2"]
    assert [m.content for m in tool_messages][:2] == ["sunny in Paris", "2800000"]
    assert tool_messages[2].status == "error" and "no tool named" in tool_messages[2].content
    assert tool_messages[3].content == "sunny in Rome"
    assert messages[-1].content.startswith("Paris is sunny")


def test_create_agent_takes_no_custom_tool_node() -> None:
    from langchain.agents import create_agent

    params = inspect.signature(create_agent).parameters
    assert "tools" in params and not any("node" in name for name in params)


def test_agent_loop_sync() -> None:
    app = build_agent(script(), NPUStreamToolExecutor([weather, population]))
    result = app.invoke({"messages": [HumanMessage("Weather in Paris, size of Rome?")],
                         "user": "ada"})
    check_transcript(result["messages"])


async def test_agent_loop_async() -> None:
    app = build_agent(script(), NPUStreamToolExecutor([weather, population]))
    result = await app.ainvoke({"messages": [HumanMessage("Weather in Paris, size of Rome?")],
                                "user": "ada"})
    check_transcript(result["messages"])


def test_lcel_chain_model_then_executor() -> None:
    executor = NPUStreamToolExecutor([weather, population])
    model = ScriptedChatModel(responses=[AIMessage("", tool_calls=[
        tool_call("population", "p", city="Paris"), tool_call("weather", "w", city="Nice")])])
    chain = model.bind_tools([weather, population]) | executor
    out = chain.invoke([HumanMessage("go")])
    assert [m.content for m in out] == ["2100000", "sunny in Nice"]
    batched = executor.batch([[tool_call("population", "a", city="Rome")],
                              [tool_call("weather", "b", city="Oslo")]])
    assert [b[0].content for b in batched] == ["2800000", "sunny in Oslo"]


@tool
def whoami(
    greeting: str,
    user: Annotated[str, InjectedState("user")],
    state: Annotated[dict, InjectedState],
    store: Annotated[Any, InjectedStore()],
    call_id: Annotated[str, InjectedToolCallId],
) -> str:
    """Reads the state and the store."""
    stored = store.get(("prefs",), user)
    color = stored.value["color"] if stored else "none"
    return f"{greeting} {user} ({len(state['messages'])} msgs, {color}, {call_id})"


@tool
def with_runtime(x: int, runtime: ToolRuntime) -> str:
    """Reads the langgraph runtime."""
    return f"{x} {runtime.tool_call_id} {runtime.state['user']} {runtime.store is not None}"


def test_injected_state_store_and_runtime_in_a_graph() -> None:
    store = InMemoryStore()
    store.put(("prefs",), "ada", {"color": "teal"})
    model = ScriptedChatModel(responses=[
        AIMessage("", tool_calls=[
            tool_call("whoami", "i1", greeting="hi", user="mallory-forged"),
            tool_call("with_runtime", "r1", x=3)]),
        AIMessage("done"),
    ])
    app = build_agent(model, NPUStreamToolExecutor([whoami, with_runtime]), store=store)
    result = app.invoke({"messages": [HumanMessage("who am I?")], "user": "ada"})
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert tool_messages[0].content == "hi ada (2 msgs, teal, i1)"
    assert tool_messages[1].content == "3 r1 ada True"


def test_injected_state_outside_a_graph_uses_the_input() -> None:
    executor = NPUStreamToolExecutor([with_runtime])
    state = {"messages": [AIMessage("", tool_calls=[tool_call("with_runtime", "r", x=1)])],
             "user": "bob"}
    assert executor.invoke(state)["messages"][0].content == "1 r bob False"
    bare = executor.invoke([tool_call("with_runtime", "r", x=1)])[0]
    assert "'NoneType' object is not subscriptable" in bare.content  # no state in bare calls
    needs_store = NPUStreamToolExecutor([whoami]).invoke(
        {"messages": [AIMessage("", tool_calls=[tool_call("whoami", "w", greeting="hi")])],
         "user": "bob"})
    assert "needs a store" in needs_store["messages"][0].content


@tool
def set_user(name: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Changes the user through a Command."""
    return Command(update={"user": name,
                           "messages": [ToolMessage(f"user is {name}", tool_call_id=tool_call_id)]})


def test_tools_returning_commands_update_the_graph() -> None:
    model = ScriptedChatModel(responses=[
        AIMessage("", tool_calls=[tool_call("set_user", "s1", name="grace"),
                                  tool_call("weather", "w1", city="Lima")]),
        AIMessage("ok"),
    ])
    app = build_agent(model, NPUStreamToolExecutor([set_user, weather]))
    result = app.invoke({"messages": [HumanMessage("rename")], "user": "ada"})
    assert result["user"] == "grace"
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.content) for m in tool_messages] == [
        ("s1", "user is grace"), ("w1", "sunny in Lima")]
    assert tool_messages[0].name == "set_user"


@tool
def ask_human(question: str) -> str:
    """Pauses the graph for a human answer."""
    return f"human said {interrupt(question)}"


def test_interrupts_propagate_and_resume() -> None:
    model = ScriptedChatModel(responses=[
        AIMessage("", tool_calls=[tool_call("ask_human", "q1", question="proceed?")]),
        AIMessage("thanks"),
    ])
    app = build_agent(model, NPUStreamToolExecutor([ask_human]), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    paused = app.invoke({"messages": [HumanMessage("start")], "user": "ada"}, config)
    assert paused["__interrupt__"][0].value == "proceed?"
    resumed = app.invoke(Command(resume="yes"), config)
    tool_messages = [m for m in resumed["messages"] if isinstance(m, ToolMessage)]
    assert tool_messages[-1].content == "human said yes"


class _Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.chains: dict[Any, str] = {}
        self.tool_parents: list[Any] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.chains[run_id] = kwargs.get("name", "")

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                      parent_run_id: Any = None, **kwargs: Any) -> None:
        self.tool_parents.append(parent_run_id)


async def test_in_a_graph_tool_runs_are_children_of_the_node_run() -> None:
    model = ScriptedChatModel(responses=[
        AIMessage("", tool_calls=[tool_call("weather", "w", city="Oslo"),
                                  tool_call("population", "p", city="Rome")]),
        AIMessage("done"),
    ])
    app = build_agent(model, NPUStreamToolExecutor([weather, population]))
    for use_async in (False, True):
        runs = _Runs()
        payload = {"messages": [HumanMessage("q")], "user": "u"}
        config = {"callbacks": [runs]}
        if use_async:
            await app.ainvoke(payload, config)
        else:
            app.invoke(payload, config)
        assert list(runs.chains.values()).count("tools") == 1  # no duplicate level
        assert [runs.chains[p] for p in runs.tool_parents] == ["tools", "tools"]
