"""``POST /v1/agent``: the configured agent (``create_ascend_agent`` from ``--config``) on a
conversation: the answer with the run's hops and tool calls as JSON, or its ``AgentEvent`` s
as server-sent events (``event: message_chunk`` / ``message`` / ``tool_result`` / ``final``).
Every run is an agent session (its KV blocks kept while its tools run): ``prompt_cache_key``
names it, else the agent gives the run a fresh one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from langchain_ascend.executor.session_hub import SESSION_KEY
from langchain_ascend.serve.convert import to_messages
from langchain_ascend.serve.http_errors import APIError, error_body, from_typed_error
from langchain_ascend.serve.openai_types import AgentRequest
from langchain_ascend.serve.responses import openai_tool_call, openai_usage
from langchain_ascend.serve.sse import DONE, EventStream, Release, event
from langchain_ascend.serve.state import ServerState
from langchain_ascend.serve.web import FastAPI, JSONResponse, Response


def message_json(message: BaseMessage) -> dict[str, Any]:
    """A message of the run in OpenAI's message shape (usage added on replies)."""
    content = message.content if isinstance(message.content, str) else str(message.content)
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": content, "tool_call_id": message.tool_call_id,
                "name": message.name, "status": message.status}
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if message.tool_calls:
            out["tool_calls"] = [openai_tool_call(call) for call in message.tool_calls]
        if message.usage_metadata:
            out["usage"] = openai_usage(message.usage_metadata)
        return out
    role = {"human": "user", "system": "system"}.get(message.type, message.type)
    return {"role": role, "content": content}


def chunk_json(message: BaseMessage) -> dict[str, Any]:
    """A streamed piece of a reply: its text and the tool-call pieces it carries."""
    content = message.content if isinstance(message.content, str) else ""
    calls = [{"index": c.get("index"), "id": c.get("id"), "name": c.get("name"),
              "arguments": c.get("args")} for c in getattr(message, "tool_call_chunks", [])]
    return {"content": content, **({"tool_calls": calls} if calls else {})}


def run_summary(messages: Sequence[BaseMessage], num_input: int) -> dict[str, Any]:
    """The answer, hops and tool calls of a finished run's ``messages``."""
    new = list(messages[num_input:])
    replies = [m for m in new if isinstance(m, AIMessage)]
    final = replies[-1] if replies else None
    return {
        "object": "agent.run",
        "answer": final.content if final is not None else "",
        "hops": len(replies),
        "tool_calls": [{"hop": hop, **openai_tool_call(call)}
                       for hop, reply in enumerate(replies, start=1)
                       for call in reply.tool_calls],
        "messages": [message_json(m) for m in new],
    }


def add_agent_route(app: FastAPI, state: ServerState) -> None:
    """Register ``POST /v1/agent`` (404 when the server has no agent)."""

    @app.post("/v1/agent", tags=["agent"], summary="Run the configured agent")
    async def run_agent(body: AgentRequest) -> Response:
        if state.agent is None:
            raise APIError(404, "this server has no agent: start it with --config "
                           "agent_config.yaml", code="agent_not_configured")
        if body.model is not None:
            state.check_chat_model(body.model)
        messages = to_messages(body.messages)
        config = session_config(body.prompt_cache_key)
        state.admission.enter()
        if body.stream:
            release = Release(leave_async(state))
            return EventStream(agent_events(state, messages, release, config), release)
        try:
            output = await state.agent.ainvoke({"messages": messages}, config)
        finally:
            state.admission.leave()
        return JSONResponse(run_summary(output["messages"], len(messages)))


def session_config(key: str | None) -> dict[str, Any] | None:
    """The run's config naming its agent session (None: the agent picks a fresh one)."""
    return None if key is None else {"metadata": {SESSION_KEY: key}}


def leave_async(state: ServerState) -> Any:
    async def leave() -> None:
        state.admission.leave()

    return leave


async def agent_events(state: ServerState, messages: list[BaseMessage],
                       release: Release, config: Any = None) -> AsyncIterator[str]:
    """The run's events as SSE; the final event carries the run summary."""
    try:
        async for item in state.agent.astream({"messages": messages}, config):
            payload: dict[str, Any] = {"kind": item.kind, "hop": item.hop}
            if item.kind == "message_chunk":
                payload["delta"] = chunk_json(item.message)
            else:
                payload["message"] = message_json(item.message)
            if item.kind == "final" and item.output is not None:
                payload["run"] = run_summary(item.output["messages"], len(messages))
            yield event(payload, name=item.kind)
        yield DONE
    except Exception as error:
        api_error = from_typed_error(error)
        yield event(error_body(api_error.status, api_error.message, api_error.param,
                               api_error.code), name="error")
        yield DONE
    finally:
        await release()

