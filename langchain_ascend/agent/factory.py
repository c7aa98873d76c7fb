"""``create_ascend_agent``: tools, retriever, executor and per-hop tool choice -> an agent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool

from langchain_ascend.agent.loop import AscendAgent
from langchain_ascend.agent.retriever_tool import DEFAULT_NAME, retriever_tool
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError
from langchain_ascend.tools import NPUStreamToolExecutor
from langchain_ascend.validation import check_count

#: ``tool_choice=None`` on a hop means: bind without a choice (the model's own default).
ToolChoice = str | dict[str, Any] | bool | None


def create_ascend_agent(
    llm: Any,
    tools: Sequence[BaseTool | Callable[..., Any]] = (),
    *,
    retriever: Any = None,
    executor: Runnable[Any, Any] | None = None,
    max_hops: int = 8,
    system_prompt: str | None = None,
    first_hop_tool_choice: ToolChoice = None,
    final_hop_tool_choice: ToolChoice = None,
    parallel_tool_calls: bool | None = None,
    retriever_name: str = DEFAULT_NAME,
    retriever_description: str | None = None,
    name: str = "ascend_agent",
) -> AscendAgent:
    """A tool-calling agent over ``llm``: model -> ``NPUStreamToolExecutor`` -> model ...

    Args:
        llm: Any chat model with ``bind_tools`` (``AscendChatModel``, ``ChatOpenAI``...).
        tools: Tools, or plain functions (turned into tools with ``@tool``). May be empty
            when ``executor`` is given: the executor's tools are bound then.
        retriever: A retriever (``AscendFAISS.as_retriever()``) or vector store, added as
            the tool ``retriever_name`` (see :func:`~.retriever_tool.retriever_tool`).
        executor: Runs each hop's calls (default: ``NPUStreamToolExecutor(tools)``). It must
            know every bound tool; a custom one that lacks the retriever's tool can be given
            ``retriever_tool(retriever)`` itself.
        max_hops: The most model calls per run (>= 1).
        system_prompt: Sent first on every model call.
        first_hop_tool_choice: ``tool_choice`` of hop 1 only, e.g. ``"required"``: a small
            model in auto mode rarely calls a tool; forcing the first call (the model still
            picks the tool and arguments) gets the agent going.
        final_hop_tool_choice: ``tool_choice`` of the last allowed hop, e.g. ``"none"``: the
            run then always ends with an answer rather than the hop-limit notice. Wins over
            ``first_hop_tool_choice`` when ``max_hops == 1``.
        parallel_tool_calls: Passed to every ``bind_tools`` call when not None
            (``AscendChatModel``: with ``False`` a forced hop asks for one call, which
            keeps a small model from inventing extra ones).
        retriever_name: The retriever tool's name.
        retriever_description: The retriever tool's description (a generic one by default).
        name: The agent's run name in traces.

    Returns:
        An :class:`~langchain_ascend.agent.loop.AscendAgent` (a ``Runnable``).

    Raises:
        InvalidRequestError: ``max_hops`` < 1, two tools with one name, a tool choice
            without tools, or an executor that lacks a bound tool.
        InvalidArgumentTypeError: ``llm`` without ``bind_tools``, tools that are not tools.

    Example:
        .. code-block:: python

            from langchain_ascend import AscendChatModel, create_ascend_agent

            agent = create_ascend_agent(
                AscendChatModel(model="Qwen/Qwen2.5-0.5B-Instruct"), [get_weather],
                retriever=store.as_retriever(), system_prompt="Use the tools.",
                first_hop_tool_choice="required", final_hop_tool_choice="none", max_hops=3)
            agent.invoke("Weather in Beijing?")["messages"][-1].content
            for event in agent.stream("Weather in Beijing?"):
                print(event.kind, event.hop, event.message.content)
    """
    check_count("max_hops", max_hops)
    bound_tools = _tool_list(tools)
    if retriever is not None:
        bound_tools.append(retriever_tool(retriever, name=retriever_name,
                                          description=retriever_description))
    if executor is None:
        executor = NPUStreamToolExecutor(bound_tools)
    elif not isinstance(executor, Runnable):
        raise InvalidArgumentTypeError(
            f"executor must be a Runnable (an NPUStreamToolExecutor); got "
            f"{type(executor).__name__}")
    else:
        known = getattr(executor, "tools_by_name", None)
        if isinstance(known, dict):
            if not bound_tools:
                bound_tools = list(known.values())
            missing = [t.name for t in bound_tools if t.name not in known]
            if missing:
                raise InvalidRequestError(
                    f"the executor has no tool named {missing!r} (it has {sorted(known)!r}); "
                    "give the executor every tool the model is offered")
    names = [t.name for t in bound_tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequestError(f"two tools are named {duplicates!r}; names must differ")
    models = _hop_models(llm, bound_tools, max_hops, first_hop_tool_choice,
                         final_hop_tool_choice, parallel_tool_calls)
    return AscendAgent(models=models, executor=executor, system_prompt=system_prompt, name=name)


def _tool_list(tools: Any) -> list[BaseTool]:
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidArgumentTypeError(
            f"tools must be a list of tools or functions; got {type(tools).__name__}")
    result: list[BaseTool] = []
    for i, item in enumerate(tools):
        if isinstance(item, BaseTool):
            result.append(item)
        elif callable(item) and not isinstance(item, type):
            result.append(as_tool(item))
        else:
            raise InvalidArgumentTypeError(
                f"tools[{i}] must be a BaseTool or a function; got {type(item).__name__}")
    return result


def _hop_models(llm: Any, tools: list[BaseTool], max_hops: int, first: ToolChoice,
                final: ToolChoice, parallel: bool | None) -> list[Runnable[Any, Any]]:
    """The bound model of each hop; hops with the same tool choice share one binding."""
    if not tools:
        if first is not None or final is not None:
            raise InvalidRequestError("first_hop_tool_choice / final_hop_tool_choice need tools")
        if not isinstance(llm, Runnable):
            raise InvalidArgumentTypeError(f"llm must be a chat model; got {type(llm).__name__}")
        return [llm] * max_hops
    if not callable(getattr(llm, "bind_tools", None)):
        raise InvalidArgumentTypeError(
            f"llm must be a chat model with bind_tools; got {type(llm).__name__}")
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    choices: list[ToolChoice] = [None] * max_hops
    choices[0] = first
    if final is not None:
        choices[-1] = final
    bound: dict[str, Runnable[Any, Any]] = {}
    models = []
    for choice in choices:
        key = repr(choice)
        if key not in bound:
            kwargs = dict(extra) if choice is None else {**extra, "tool_choice": choice}
            bound[key] = llm.bind_tools(tools, **kwargs)
        models.append(bound[key])
    return models
