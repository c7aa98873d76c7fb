"""The agent helper: ``create_ascend_agent(llm, tools, ...)`` -> a Runnable that loops
model -> ``NPUStreamToolExecutor`` -> model until the model answers.

Modules: :mod:`.factory` (assembly: tools, retriever tool, executor, per-hop tool choice),
:mod:`.loop` (the Runnable and its invoke / ainvoke / stream / astream drivers),
:mod:`.hops` (one run's state, no I/O), :mod:`.events` (what ``stream`` yields),
:mod:`.retriever_tool` (a retriever as a tool).
"""

from __future__ import annotations

from langchain_ascend.agent.events import AgentEvent, EventKind
from langchain_ascend.agent.factory import create_ascend_agent
from langchain_ascend.agent.hops import HOP_LIMIT_REASON, HOP_METADATA_KEY
from langchain_ascend.agent.loop import AscendAgent
from langchain_ascend.agent.retriever_tool import RetrieverTool, retriever_tool

__all__ = [
    "HOP_LIMIT_REASON",
    "HOP_METADATA_KEY",
    "AgentEvent",
    "AscendAgent",
    "EventKind",
    "RetrieverTool",
    "create_ascend_agent",
    "retriever_tool",
]
