"""OpenAI requests -> LangChain messages and ``AscendChatModel`` call arguments.

Pure functions over the request models of :mod:`~langchain_ascend.serve.openai_types`; each
problem the request model cannot express is an :class:`~langchain_ascend.serve.http_errors.APIError`
(400) naming the field. Templating, tool rendering and grammars stay the chat model's.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_ascend.engine.core.retention import parse_retention
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.serve.http_errors import APIError
from langchain_ascend.serve.openai_types import ChatCompletionRequest, ChatMessage


def unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


def check_supported(request: ChatCompletionRequest, *, penalties: bool = False) -> None:
    """Fields OpenAI has that this server honours only at their no-op value (the penalties
    too when the chat model has none: ``penalties=False``).

    Raises:
        APIError: 400 naming the field (``n`` > 1, ``logprobs``, penalties, ``logit_bias``,
            ``stream_options`` without ``stream``).
    """
    if request.n is not None and request.n > 1:
        raise unsupported("n", f"n={request.n} is not supported: one choice per request (n=1)")
    if request.logprobs:
        raise unsupported("logprobs", "logprobs are not supported")
    if request.top_logprobs:
        raise unsupported("top_logprobs", "top_logprobs are not supported")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(request, name) and not penalties:
            raise unsupported(name, f"{name} is not supported (only 0)")
    if request.logit_bias:
        raise unsupported("logit_bias", "logit_bias is not supported")
    if request.stream_options is not None and not request.stream:
        raise APIError(400, "stream_options is only allowed with stream=true",
                       param="stream_options", code="invalid_value")


def text_of(message: ChatMessage, index: int) -> str:
    """A message's content as one string (text parts joined)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def tool_calls_of(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """An assistant message's tool calls as LangChain ``ToolCall`` dicts.

    Raises:
        APIError: Arguments that are not a JSON object, naming the call.
    """
    calls = []
    for j, call in enumerate(message.tool_calls or []):
        param = f"messages[{index}].tool_calls[{j}].function.arguments"
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as error:
            raise APIError(400, f"{param} is not valid JSON: {error}", param=param,
                           code="invalid_value") from error
        if not isinstance(args, dict):
            raise APIError(400, f"{param} must encode a JSON object", param=param,
                           code="invalid_value")
        calls.append({"name": call.function.name, "args": args, "id": call.id,
                      "type": "tool_call"})
    return calls


def to_message(message: ChatMessage, index: int) -> BaseMessage:
    """One OpenAI message as a LangChain message.

    Raises:
        APIError: A field the role does not take, or a tool message without ``tool_call_id``.
    """
    text = text_of(message, index)
    role = message.role
    if message.tool_calls and role != "assistant":
        raise APIError(400, f"only assistant messages carry tool_calls (messages[{index}] is "
                       f"{role!r})", param=f"messages[{index}].tool_calls", code="invalid_value")
    if role in ("system", "developer"):
        return SystemMessage(content=text)
    if role == "user":
        return HumanMessage(content=text, **({"name": message.name} if message.name else {}))
    if role == "assistant":
        return AIMessage(content=text, tool_calls=tool_calls_of(message, index))
    if not message.tool_call_id:
        raise APIError(400, f"messages[{index}] has role 'tool' but no tool_call_id",
                       param=f"messages[{index}].tool_call_id", code="invalid_value")
    return ToolMessage(content=text, tool_call_id=message.tool_call_id)


def to_messages(messages: list[ChatMessage]) -> list[BaseMessage]:
    """The conversation as LangChain messages (a tool message must answer an earlier call)."""
    out: list[BaseMessage] = []
    call_ids: set[str] = set()
    for index, message in enumerate(messages):
        converted = to_message(message, index)
        if isinstance(converted, AIMessage):
            call_ids.update(call["id"] for call in converted.tool_calls if call["id"])
        if isinstance(converted, ToolMessage) and converted.tool_call_id not in call_ids:
            raise APIError(400, f"messages[{index}].tool_call_id {converted.tool_call_id!r} "
                           "answers no tool call of an earlier assistant message",
                           param=f"messages[{index}].tool_call_id", code="invalid_value")
        out.append(converted)
    return out


def tool_choice_of(request: ChatCompletionRequest) -> str | dict[str, Any] | None:
    """The request's ``tool_choice`` checked against its tools.

    Raises:
        APIError: A forcing choice without tools, or a name that is no tool.
    """
    choice = request.tool_choice
    names = [tool.function.name for tool in request.tools or []]
    if choice is None or choice in ("auto", "none"):
        return choice
    if not names:
        raise APIError(400, f"tool_choice {choice if isinstance(choice, str) else 'function'!r} "
                       "needs tools, and the request has none", param="tool_choice",
                       code="invalid_value")
    if isinstance(choice, str):
        return choice
    if choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not one of "
                       f"the request's tools {names}", param="tool_choice.function.name",
                       code="invalid_value")
    return {"type": "function", "function": {"name": choice.function.name}}


def response_format_of(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """``response_format`` as the chat model takes it (None for free text).

    Raises:
        APIError: ``json_schema`` without its schema.
    """
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    body = fmt.json_schema
    if body is None or body.schema_ is None:
        raise APIError(400, "response_format type 'json_schema' needs json_schema.schema",
                       param="response_format.json_schema", code="invalid_value")
    return {"type": "json_schema",
            "json_schema": {"name": body.name, "schema": body.schema_, "strict": body.strict}}


def call_kwargs(request: ChatCompletionRequest, *, penalties: bool = False) -> dict[str, Any]:
    """The chat model call arguments of a request (``stop`` included); ``penalties``: the
    chat model takes ``presence_penalty`` / ``frequency_penalty``."""
    check_supported(request, penalties=penalties)
    kwargs: dict[str, Any] = {}
    if request.tools:
        kwargs["tools"] = [tool.model_dump(exclude_none=True) for tool in request.tools]
    choice = tool_choice_of(request)
    if choice is not None and request.tools:
        kwargs["tool_choice"] = choice
    if request.parallel_tool_calls is not None and request.tools:
        kwargs["parallel_tool_calls"] = request.parallel_tool_calls
    response_format = response_format_of(request)
    if response_format is not None:
        kwargs["response_format"] = response_format
    max_tokens = request.max_completion_tokens or request.max_tokens
    if max_tokens is not None:  # past the context: 400, as OpenAI and vLLM answer
        kwargs["max_tokens"] = max_tokens
        kwargs["max_tokens_overflow"] = "error"
    names = ("temperature", "top_p", "seed", "ignore_eos") + (
        ("presence_penalty", "frequency_penalty") if penalties else ())
    for name in names:
        value = getattr(request, name)
        if value is not None:
            kwargs[name] = value
    if request.stop:
        kwargs["stop"] = [request.stop] if isinstance(request.stop, str) else request.stop
    kwargs.update(session_kwargs(request))
    return kwargs


def session_kwargs(request: ChatCompletionRequest) -> dict[str, Any]:
    """``session_id`` / ``session_retention`` from ``prompt_cache_key`` and
    ``prompt_cache_retention`` (else the longest ``cache_control.ttl`` of the messages);
    none without a key.

    Raises:
        APIError: A retention that is not ``"in_memory"`` or a duration (400).
    """
    if request.prompt_cache_key is None:
        return {}
    retention: Any = request.prompt_cache_retention
    param = "prompt_cache_retention"
    if retention is None:
        ttls = [part.cache_control.ttl for message in request.messages
                if isinstance(message.content, list) for part in message.content
                if part.cache_control is not None and part.cache_control.ttl is not None]
        if ttls:
            param = "messages.content.cache_control.ttl"
            try:
                retention = max(ttls, key=lambda t: parse_retention(t) or 0.0)
            except InvalidRequestError as exc:
                raise APIError(400, str(exc), param=param) from exc
    try:
        parse_retention(retention)
    except InvalidRequestError as exc:
        raise APIError(400, str(exc), param=param) from exc
    out: dict[str, Any] = {"session_id": request.prompt_cache_key}
    if retention is not None:
        out["session_retention"] = retention
    return out
