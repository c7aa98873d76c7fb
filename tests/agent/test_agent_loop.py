"""create_ascend_agent's control flow, driven by a scripted chat model (no LLM): when the loop
stops, the hop limit, tool errors fed back, parallel calls, per-hop tool choice, inputs,
callbacks, batch and the async paths."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import pytest
from agent_test_helpers import call, responding, scripted
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import InjectedState
from tool_test_helpers import Gate

from langchain_ascend import NPUStreamToolExecutor, create_ascend_agent
from langchain_ascend.agent import HOP_LIMIT_REASON, AscendAgent
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError


@tool
def weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


@tool
def broken(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"disk on fire ({x})")


def kinds(messages: list[Any]) -> list[str]:
    return [type(m).__name__.removesuffix("Message") for m in messages]


def test_stops_at_the_first_reply_without_tool_calls() -> None:
    model = scripted(AIMessage("", tool_calls=[call("weather", "w1", city="Oslo")]),
                     AIMessage("Oslo is sunny."),
                     AIMessage("never reached"))
    out = create_ascend_agent(model, [weather]).invoke("Weather in Oslo?")
    messages = out["messages"]
    assert kinds(messages) == ["Human", "AI", "Tool", "AI"]
    assert messages[2].content == "sunny in Oslo" and messages[2].tool_call_id == "w1"
    assert messages[-1].content == "Oslo is sunny."
    assert len(model.calls) == 2 and model.responses[0].content == "never reached"
    # the second hop saw the first hop's call and its result
    assert kinds(model.calls[1]["messages"]) == ["Human", "AI", "Tool"]


def test_max_hops_ends_with_a_message_that_says_so() -> None:
    model = responding(lambda msgs: AIMessage(
        "", tool_calls=[call("weather", f"w{len(msgs)}", city="Rome")]))
    out = create_ascend_agent(model, [weather], max_hops=3).invoke("loop forever")
    messages = out["messages"]
    assert len(model.calls) == 3
    # every call of the last hop still got its result, then the notice
    assert kinds(messages) == ["Human", "AI", "Tool", "AI", "Tool", "AI", "Tool", "AI"]
    final = messages[-1]
    assert final.tool_calls == []
    assert final.response_metadata["finish_reason"] == HOP_LIMIT_REASON
    assert final.response_metadata["max_hops"] == 3
    assert "limit of 3 model call" in final.content


def test_tool_errors_come_back_as_tool_messages_the_model_reads() -> None:
    model = scripted(
        AIMessage("", tool_calls=[call("broken", "b1", x=7), call("no_such_tool", "n1"),
                                  call("weather", "w1", city="Lima")]),
        AIMessage("Lima is sunny; the rest failed."))
    out = create_ascend_agent(model, [weather, broken]).invoke("go")
    results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["b1", "n1", "w1"]
    assert [m.status for m in results] == ["error", "error", "success"]
    assert "disk on fire (7)" in results[0].content
    assert "no_such_tool" in results[1].content and "weather" in results[1].content
    seen = model.calls[1]["messages"]
    assert [m.content for m in seen[2:]] == [m.content for m in results]
    assert out["messages"][-1].content.startswith("Lima is sunny")


def test_parallel_calls_of_one_hop_run_at_once_and_come_back_in_call_order() -> None:
    gate = Gate(target=3)

    @tool
    def slow(n: int) -> str:
        """Waits until three calls are inside together."""
        gate.pass_through()
        time.sleep(0.01 * (3 - n))  # the first call finishes last
        return f"done {n}"

    model = scripted(AIMessage("", tool_calls=[call("slow", f"s{n}", n=n) for n in range(3)]),
                     AIMessage("all done"))
    start = time.perf_counter()
    out = create_ascend_agent(model, [slow]).invoke("go")
    assert time.perf_counter() - start < 1.5  # no gate timeout: they did overlap
    assert gate.peak == 3
    results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == ["done 0", "done 1", "done 2"]


def test_first_and_final_hop_tool_choice() -> None:
    model = responding(lambda msgs: AIMessage("", tool_calls=[call("weather", "w", city="X")])
                       if len(msgs) < 5 else AIMessage("answer"))
    agent = create_ascend_agent(model, [weather], max_hops=4, first_hop_tool_choice="required",
                                final_hop_tool_choice="none", parallel_tool_calls=False)
    agent.invoke("q")
    choices = [c["kwargs"].get("tool_choice") for c in model.calls]
    assert choices == ["required", None, None]  # the reply at hop 3 had no calls: stopped
    assert all(c["kwargs"]["parallel_tool_calls"] is False for c in model.calls)
    assert all(c["kwargs"]["bound_tools"] == ["weather"] for c in model.calls)

    looping = responding(lambda msgs: AIMessage("", tool_calls=[call("weather", "w", city="X")]))
    create_ascend_agent(looping, [weather], max_hops=3, first_hop_tool_choice="required",
                        final_hop_tool_choice="none").invoke("q")
    assert [c["kwargs"].get("tool_choice") for c in looping.calls] == ["required", None, "none"]
    assert "parallel_tool_calls" not in looping.calls[0]["kwargs"]

    single = scripted(AIMessage("one hop"))
    create_ascend_agent(single, [weather], max_hops=1, first_hop_tool_choice="required",
                        final_hop_tool_choice="none").invoke("q")
    assert single.calls[0]["kwargs"]["tool_choice"] == "none"  # the last hop must answer


def test_system_prompt_goes_first_on_every_call_and_is_not_stored() -> None:
    model = scripted(AIMessage("", tool_calls=[call("weather", "w1", city="Oslo")]),
                     AIMessage("fine"))
    out = create_ascend_agent(model, [weather], system_prompt="Be brief.").invoke("q")
    for recorded in model.calls:
        first = recorded["messages"][0]
        assert isinstance(first, SystemMessage) and first.content == "Be brief."
        assert sum(isinstance(m, SystemMessage) for m in recorded["messages"]) == 1
    assert not any(isinstance(m, SystemMessage) for m in out["messages"])


@tool
def whoami(greeting: str, user: Annotated[str, InjectedState("user")]) -> str:
    """Greets the user named in the agent state."""
    return f"{greeting} {user}"


def test_inputs_string_messages_and_state_dict() -> None:
    def reply(msgs: list[Any]) -> AIMessage:
        return AIMessage(f"{len(msgs)} in")

    agent = create_ascend_agent(responding(reply), [weather])
    assert agent.invoke("hi")["messages"][-1].content == "1 in"
    history = [("human", "a"), ("ai", "b"), HumanMessage("c")]
    out = agent.invoke(history)
    assert kinds(out["messages"]) == ["Human", "AI", "Human", "AI"]
    assert out["messages"][-1].content == "3 in"

    model = scripted(AIMessage("", tool_calls=[call("whoami", "i1", greeting="hi")]),
                     AIMessage("ok"))
    state = create_ascend_agent(model, [whoami]).invoke(
        {"messages": [HumanMessage("who?")], "user": "ada"})
    assert state["user"] == "ada"  # other state keys are kept
    assert state["messages"][2].content == "hi ada"  # and tools can read them

    # an output plus a new turn is the next run's input
    again = agent.invoke({"messages": [*out["messages"], HumanMessage("d")]})
    assert again["messages"][-1].content == "5 in"


def test_bad_arguments_are_refused_with_typed_errors() -> None:
    model = scripted()
    with pytest.raises(InvalidRequestError, match="max_hops"):
        create_ascend_agent(model, [weather], max_hops=0)
    with pytest.raises(InvalidRequestError, match="names must differ"):
        create_ascend_agent(model, [weather, weather])
    with pytest.raises(InvalidRequestError, match="executor has no tool named"):
        create_ascend_agent(model, [weather, broken], executor=NPUStreamToolExecutor([weather]))
    with pytest.raises(InvalidRequestError, match="need tools"):
        create_ascend_agent(model, [], first_hop_tool_choice="required")
    with pytest.raises(InvalidArgumentTypeError, match="bind_tools"):
        create_ascend_agent(object(), [weather])
    agent = create_ascend_agent(model, [weather])
    with pytest.raises(InvalidArgumentTypeError, match="'messages' key"):
        agent.invoke({"question": "hi"})
    with pytest.raises(InvalidArgumentTypeError):
        agent.invoke(42)
    with pytest.raises(InvalidRequestError, match="at least one message"):
        agent.invoke([])


def test_a_given_executor_is_used_and_its_tools_bound() -> None:
    executor = NPUStreamToolExecutor([weather], timeout_ms=50)
    model = scripted(AIMessage("", tool_calls=[call("weather", "w1", city="Bern")]),
                     AIMessage("ok"))
    agent = create_ascend_agent(model, [], executor=executor)
    assert isinstance(agent, AscendAgent) and agent.executor is executor
    out = agent.invoke("q")
    assert model.calls[0]["kwargs"]["bound_tools"] == ["weather"]
    assert out["messages"][2].response_metadata["tool_timing"]["attempts"] == 1


class Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.runs: dict[Any, tuple[str, Any, dict[str, Any]]] = {}

    def _add(self, kind: str, run_id: Any, parent: Any, kwargs: dict[str, Any]) -> None:
        self.runs[run_id] = (kind, parent, kwargs.get("metadata") or {})

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any,
                       parent_run_id: Any = None, **kwargs: Any) -> None:
        self._add("chain:" + str(kwargs.get("name")), run_id, parent_run_id, kwargs)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any,
                            parent_run_id: Any = None, **kwargs: Any) -> None:
        self._add("model", run_id, parent_run_id, kwargs)

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: Any,
                      parent_run_id: Any = None, **kwargs: Any) -> None:
        self._add("tool:" + str(serialized.get("name")), run_id, parent_run_id, kwargs)

    def of(self, kind: str) -> list[tuple[Any, dict[str, Any]]]:
        return [(parent, meta) for k, parent, meta in self.runs.values() if k == kind]


@pytest.mark.parametrize("mode", ["invoke", "stream", "ainvoke", "astream"])
async def test_callbacks_see_every_hop_under_the_agent_run(mode: str) -> None:
    model = scripted(AIMessage("", tool_calls=[call("weather", "w1", city="A"),
                                               call("weather", "w2", city="B")]),
                     AIMessage("", tool_calls=[call("weather", "w3", city="C")]),
                     AIMessage("done"))
    agent = create_ascend_agent(model, [weather], name="my_agent")
    runs = Runs()
    config: Any = {"callbacks": [runs], "metadata": {"user": "u1"}}
    if mode == "invoke":
        agent.invoke("q", config)
    elif mode == "ainvoke":
        await agent.ainvoke("q", config)
    elif mode == "stream":
        list(agent.stream("q", config))
    else:
        [e async for e in agent.astream("q", config)]
    (agent_run,) = [rid for rid, (k, _, _) in runs.runs.items() if k == "chain:my_agent"]
    models = runs.of("model")
    assert [meta["agent_hop"] for _, meta in models] == [1, 2, 3]
    assert all(parent == agent_run and meta["user"] == "u1" for parent, meta in models)
    executors = runs.of("chain:tools")
    assert [meta["agent_hop"] for _, meta in executors] == [1, 2]
    assert all(parent == agent_run for parent, _ in executors)
    tools = runs.of("tool:weather")
    assert sorted(meta["agent_hop"] for _, meta in tools) == [1, 1, 2]
    assert all(runs.runs[parent][0] == "chain:tools" for parent, _ in tools)


def _per_city(msgs: list[Any]) -> AIMessage:
    """Calls weather for the city in the question, then answers with its result."""
    question = msgs[0].content
    if isinstance(msgs[-1], ToolMessage):
        return AIMessage(f"answer: {msgs[-1].content}")
    return AIMessage("", tool_calls=[call("weather", f"w-{question}", city=question)])


def test_batch_runs_one_independent_loop_per_input_concurrently() -> None:
    gate = Gate(target=4)

    @tool
    def weather(city: str) -> str:  # noqa: F811 - the scripted model calls it by this name
        """Weather of a city."""
        gate.pass_through()
        return f"sunny in {city}"

    model = responding(_per_city)
    cities = ["Oslo", "Rome", "Lima", "Bern"]
    start = time.perf_counter()
    outs = create_ascend_agent(model, [weather]).batch(cities)
    assert time.perf_counter() - start < 1.5 and gate.peak == 4  # the four loops overlapped
    assert [o["messages"][-1].content for o in outs] == [f"answer: sunny in {c}" for c in cities]
    assert all(kinds(o["messages"]) == ["Human", "AI", "Tool", "AI"] for o in outs)


async def test_abatch_and_ainvoke_run_async_tools_concurrently() -> None:
    inside = 0
    peak = 0

    @tool
    async def weather(city: str) -> str:  # noqa: F811
        """Weather of a city."""
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0.05)
        inside -= 1
        return f"sunny in {city}"

    agent = create_ascend_agent(responding(_per_city), [weather])
    cities = ["Oslo", "Rome", "Lima"]
    outs = await agent.abatch(cities)
    assert [o["messages"][-1].content for o in outs] == [f"answer: sunny in {c}" for c in cities]
    assert peak == 3
    single = await agent.ainvoke("Nice")
    assert single["messages"][-1].content == "answer: sunny in Nice"


def test_plain_functions_become_tools() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = scripted(AIMessage("", tool_calls=[call("add", "a1", a=2, b=3)]), AIMessage("5"))
    out = create_ascend_agent(model, [add]).invoke("2+3?")
    assert model.calls[0]["kwargs"]["bound_tools"] == ["add"]
    assert out["messages"][2].content == "5"
