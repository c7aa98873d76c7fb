"""AscendChatModel inside LCEL, langchain agents and langgraph (tiny random model).

A random model cannot decide to call a tool, so these tests force the choice per hop with
``tool_choice`` — exactly what constrained decoding guarantees — and check that the
surrounding machinery runs the tool and feeds the result back.
"""

from __future__ import annotations

import shutil
from typing import Any

from chat_test_tools import get_weather
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_ascend.chat_models import AscendChatModel


def test_prompt_model_parser_chain(tiny_chat):
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You answer in {language}."), ("human", "{question}")])
    chain = prompt | tiny_chat | StrOutputParser()
    answer = chain.invoke({"language": "French", "question": "Where is Paris?"})
    direct = tiny_chat.invoke(prompt.invoke(
        {"language": "French", "question": "Where is Paris?"}).to_messages())
    assert isinstance(answer, str) and answer == direct.content
    assert chain.batch([{"language": "German", "question": "Hi"}] * 2) == [
        chain.invoke({"language": "German", "question": "Hi"})] * 2


def test_create_agent_runs_a_forced_tool_call_then_answers(tiny_chat):
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware

    class ForceWeatherFirst(AgentMiddleware):
        """First hop must call get_weather; after the tool result the model must answer."""

        def wrap_model_call(self, request, handler):
            last = request.messages[-1]
            choice = "none" if isinstance(last, ToolMessage) else "get_weather"
            return handler(request.override(tool_choice=choice))

    agent = create_agent(tiny_chat.model_copy(update={"max_tokens": 48}), tools=[get_weather],
                         middleware=[ForceWeatherFirst()])
    state = agent.invoke({"messages": [HumanMessage("Weather in Oslo?")]})
    messages = state["messages"]
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    (call,) = messages[1].tool_calls
    assert call["name"] == "get_weather"
    assert messages[2].tool_call_id == call["id"]
    assert messages[2].content == get_weather.invoke(call["args"])
    assert messages[3].tool_calls == []


def test_create_agent_goes_on_after_a_call_cut_at_max_tokens(tiny_chat):
    """create_agent answers an invalid call with an error ToolMessage before the next model
    call; the conversation holding both must render (it raised "answers no tool call")."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware

    class ForceFirst(AgentMiddleware):
        def wrap_model_call(self, request, handler):
            first = len(request.messages) == 1
            return handler(request.override(tool_choice="get_weather" if first else "none"))

    agent = create_agent(tiny_chat.model_copy(update={"max_tokens": 6}), tools=[get_weather],
                         middleware=[ForceFirst()])
    first = agent.invoke({"messages": [HumanMessage("Weather in Oslo?")]})["messages"]
    (cut,) = first[-1].invalid_tool_calls
    assert first[-1].tool_calls == [] and cut["id"]
    second = agent.invoke({"messages": [*first, HumanMessage("Just say hi.")]})["messages"]
    answered = [m for m in second if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in answered] == [cut["id"]] and answered[0].status == "error"
    assert isinstance(second[-1], AIMessage) and second[-1].tool_calls == []


def test_langgraph_state_graph_with_tool_node_reuses_the_prompt_cache(tiny_chat):
    llm = tiny_chat.model_copy(update={"max_tokens": 48})
    usages: list[dict] = []

    def agent(state: MessagesState) -> dict:
        after_tool = isinstance(state["messages"][-1], ToolMessage)
        model = llm.bind_tools([get_weather], tool_choice="none" if after_tool else "get_weather")
        reply = model.invoke(state["messages"])
        usages.append(reply.usage_metadata)
        return {"messages": [reply]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    app = graph.compile()

    result = app.invoke({"messages": [HumanMessage("Forecast for Rome please")]})
    kinds = [type(m).__name__ for m in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert isinstance(result["messages"][-1], AIMessage)
    # The second hop starts with the first hop's prompt: most of it comes from the cache.
    first, second = usages
    assert second["input_tokens"] > first["input_tokens"]
    block = tiny_chat._engine_for().block_size
    assert second["input_token_details"]["cache_read"] >= first["input_tokens"] - 2 * block


def test_with_fallbacks_switches_to_the_working_model(tiny_chat, tiny_qwen2_path, tmp_path):
    # A model that loads but cannot serve a chat call (its chat template is gone).
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_qwen2_path, folder)
    (folder / "chat_template.jinja").unlink()
    broken = AscendChatModel(model=str(folder), device="cpu")
    chain = broken.with_fallbacks([tiny_chat])
    message = chain.invoke("Hello")
    assert message.content == tiny_chat.invoke("Hello").content


class _FailFirstStart(BaseCallbackHandler):
    raise_error = True

    def __init__(self) -> None:
        self.starts = 0

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.starts += 1
        if self.starts == 1:
            raise ConnectionError("transient failure before the first attempt")


def test_with_retry_retries_and_then_succeeds(tiny_chat):
    handler = _FailFirstStart()
    retrying = tiny_chat.with_retry(stop_after_attempt=3, wait_exponential_jitter=False,
                                    retry_if_exception_type=(ConnectionError,))
    message = retrying.invoke("Hello", config={"callbacks": [handler]})
    assert handler.starts == 2
    assert message.content == tiny_chat.invoke("Hello").content


async def test_async_agent_graph(tiny_chat):
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware

    class ForceOnce(AgentMiddleware):
        async def awrap_model_call(self, request, handler):
            last = request.messages[-1]
            choice = "none" if isinstance(last, ToolMessage) else "required"
            return await handler(request.override(tool_choice=choice))

    agent = create_agent(tiny_chat.model_copy(update={"max_tokens": 48}), tools=[get_weather],
                         middleware=[ForceOnce()])
    state = await agent.ainvoke({"messages": [HumanMessage("Weather?")]})
    assert isinstance(state["messages"][2], ToolMessage)
    assert isinstance(state["messages"][-1], AIMessage)
