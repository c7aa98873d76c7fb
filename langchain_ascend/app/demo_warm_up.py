"""The demo's last setup stage: the grammars its agent's hops ask for, and the agent prompt
(system prompt and tool schemas, which every hop starts with) in the prefix cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_ascend.app.stage_times import stages

__all__ = ["hop_calls", "warm_up_agent"]


def hop_calls(agent: Any) -> list[dict[str, Any]]:
    """The call arguments each hop's model is bound with (tools, tool_choice,
    parallel_tool_calls): what its requests' grammars are picked from."""
    return [dict(model.kwargs) for model in agent.models
            if isinstance(getattr(model, "kwargs", None), Mapping)]


def warm_up_agent(llm: Any, agent: Any, *, progress: bool) -> None:
    """The grammars the agent's hops ask for (only those: a forced call under
    ``parallel_tool_calls=False`` is not the grammar ``warm_up(tools=)`` would compile), and
    the system prompt and tool schemas every hop starts with."""
    from langchain_core.messages import HumanMessage, SystemMessage

    with stages("warm-up", ["tool grammars", "agent prompt -> prefix cache"],
                enabled=progress) as advance:
        llm.warm_up(calls=hop_calls(agent))
        advance()
        system = [SystemMessage(agent.system_prompt)] if agent.system_prompt else []
        agent.models[0].invoke([*system, HumanMessage("Hi")], max_tokens=1)
        advance()
