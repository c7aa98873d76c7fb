"""LangChain messages and tools -> the dicts a Hugging Face chat template renders.

Pure functions (no torch). The chat model calls :func:`to_template_messages`,
:func:`to_template_tools` and :func:`render_prompt`; each raises a typed error naming the
offending message when the input cannot be rendered:

* an empty conversation -> :class:`~langchain_ascend.errors.InvalidRequestError`;
* an image / audio / file / unknown content block ->
  :class:`~langchain_ascend.errors.UnsupportedContentError`;
* a ``ToolMessage`` answering no earlier tool call -> ``InvalidRequestError``;
* a tokenizer without a chat template, or a template that rejects the conversation ->
  :class:`~langchain_ascend.errors.ChatTemplateError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool

from langchain_ascend.chat.content_text import shield_text
from langchain_ascend.chat.template import HOW_TO_SET
from langchain_ascend.chat.tool_schemas import openai_tool, schema_problem
from langchain_ascend.errors import (
    ChatTemplateError,
    InvalidArgumentTypeError,
    InvalidRequestError,
    UnsupportedContentError,
)
from langchain_ascend.validation import as_items

# Content blocks an assistant message may carry that the tool_calls / reasoning fields already
# describe: dropped when rendering.
_AI_SIDE_BLOCKS = frozenset(
    {"tool_use", "tool_call", "tool_call_chunk", "function_call", "thinking",
     "redacted_thinking", "reasoning", "server_tool_call", "server_tool_result"}
)
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})

_ROLE_BY_TYPE = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def content_to_text(content: str | list[Any], *, role: str, index: int) -> str:
    """Flatten message content (a string or a list of blocks) to the text a template renders.

    Text blocks are joined with newlines. Assistant-side blocks (``tool_use``, ``thinking``...)
    are skipped on assistant messages; a tool result may also hold JSON-like blocks without a
    ``type``, which are serialised.

    Raises:
        UnsupportedContentError: For images, audio, files and any other block type.
    """
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        if not isinstance(block, Mapping):
            raise UnsupportedContentError(
                f"message {index} ({role}): content item of type {type(block).__name__} is not "
                "supported; use strings or {'type': 'text', 'text': ...} blocks"
            )
        block_type = block.get("type")
        if block_type in _TEXT_BLOCKS:
            text = block.get("text")
            if not isinstance(text, str):
                raise UnsupportedContentError(
                    f"message {index} ({role}): text block without a string 'text' field"
                )
            parts.append(text)
        elif role == "assistant" and block_type in _AI_SIDE_BLOCKS:
            continue
        elif role == "tool" and block_type is None:
            parts.append(json.dumps(dict(block), ensure_ascii=False))
        else:
            raise UnsupportedContentError(
                f"message {index} ({role}): content block of type {block_type!r} is not "
                "supported; this model reads text only (blocks of type 'text')"
            )
    return "\n".join(parts)


def _template_tool_calls(message: AIMessage) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "id": call.get("id"),
            "function": {"name": call["name"], "arguments": call.get("args") or {}},
        }
        for call in message.tool_calls
    ]


def to_template_messages(messages: Sequence[BaseMessage], *, strict: bool = True,
                         spellings: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Convert a LangChain conversation into chat-template message dicts.

    Roles: system, user, assistant (with ``tool_calls`` as
    ``{"type": "function", "id", "function": {"name", "arguments": dict}}``; its
    ``invalid_tool_calls`` as the text they hold, their ids answerable), tool (with
    ``tool_call_id`` and ``name``); a ``ChatMessage`` keeps its role. An assistant message's
    ``additional_kwargs["reasoning_content"]`` is passed on for templates that render it.
    With ``strict=False`` (token counting of a conversation's slices) an empty list is ``[]``
    and a ``ToolMessage`` answering no earlier call is rendered as it is. ``spellings``: the
    tokenizer's control tokens, kept text where a content spells one (``chat.content_text``).

    Raises:
        InvalidRequestError: Empty conversation, unknown message type, or a ``ToolMessage``
            whose ``tool_call_id`` matches no tool call of an earlier assistant message.
        UnsupportedContentError: Non-text content.
    """
    if not messages and strict:
        raise InvalidRequestError("messages is empty: a chat request needs at least one message")
    rendered: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for index, message in enumerate(messages):
        role: str | None
        if isinstance(message, ChatMessage):
            role = message.role
        else:
            role = _ROLE_BY_TYPE.get(message.type)
        if role is None or not isinstance(
            message, (SystemMessage, HumanMessage, AIMessage, ToolMessage, ChatMessage)
        ):
            raise InvalidRequestError(
                f"message {index}: messages of type {message.type!r} are not supported; use "
                "SystemMessage, HumanMessage, AIMessage or ToolMessage"
            )
        entry: dict[str, Any] = {
            "role": role,
            "content": shield_text(content_to_text(message.content, role=role, index=index),
                                   spellings),
        }
        if isinstance(message, AIMessage):
            if message.tool_calls:
                entry["tool_calls"] = _template_tool_calls(message)
                for call in message.tool_calls:
                    if call.get("id"):
                        call_names[str(call["id"])] = call["name"]
            # An invalid call (broken, or cut at max_tokens) is text the model wrote: its
            # ``args`` hold that text, markers included. An agent may answer it with an error
            # ToolMessage (langchain's create_agent does), so its id is a known call.
            for call in message.invalid_tool_calls:
                entry["content"] += str(call.get("args") or "")
                if call.get("id"):
                    call_names[str(call["id"])] = call.get("name") or "tool"
            reasoning = message.additional_kwargs.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                entry["reasoning_content"] = reasoning
        elif isinstance(message, ToolMessage):
            if message.tool_call_id not in call_names and strict:
                raise InvalidRequestError(
                    f"message {index}: ToolMessage with tool_call_id={message.tool_call_id!r} "
                    "answers no tool call of an earlier AIMessage; known ids: "
                    f"{sorted(call_names) or 'none'}"
                )
            entry["tool_call_id"] = message.tool_call_id
            entry["name"] = message.name or call_names.get(message.tool_call_id, "tool")
        elif message.name and role == "user":
            entry["name"] = message.name
        rendered.append(entry)
    return rendered


def merge_consecutive_roles(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge neighbouring system/user/assistant messages of one role (for strict templates).

    Templates such as Mistral's raise when roles do not alternate; two human messages in a
    row are then joined with a blank line. Messages with tool calls and tool results are kept
    as they are.
    """
    merged: list[dict[str, Any]] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and previous["role"] == message["role"]
            and message["role"] in ("system", "user", "assistant")
            and "tool_calls" not in previous
            and "tool_calls" not in message
        ):
            previous["content"] = "\n\n".join(
                part for part in (previous["content"], message["content"]) if part
            )
            continue
        merged.append(dict(message))
    return merged


def to_template_tools(tools: Any) -> list[dict[str, Any]]:
    """Convert LangChain tools, pydantic models, functions or dicts to OpenAI tool dicts.

    The result (``{"type": "function", "function": {"name", "description", "parameters"}}``)
    is what ``apply_chat_template(tools=...)`` expects. One tool (not in a list) is one tool;
    a string is refused (a tool name is not a tool).

    Raises:
        InvalidArgumentTypeError: ``tools`` is a string, or not a list of tools.
        InvalidRequestError: A tool that ``tool_schemas.openai_tool`` cannot convert, or a tool
            dict without a non-empty string ``name``.
    """
    if isinstance(tools, (Mapping, type, BaseTool)) or (
            callable(tools) and not isinstance(tools, str)):
        tools = [tools]
    items = as_items("tools", tools, str_is_item=False, error=InvalidArgumentTypeError,
                     what="a list of tools")
    converted = []
    for i, tool in enumerate(items or ()):
        if isinstance(tool, (str, bytes)):
            raise InvalidArgumentTypeError(
                f"tools[{i}] is the string {tool!r}; pass the tool itself (a BaseTool, "
                "function, pydantic class or OpenAI tool dict), not its name")
        try:
            schema = openai_tool(tool)
        except Exception as exc:  # langchain raises ValueError / TypeError / KeyError variants
            raise InvalidRequestError(
                f"cannot convert tools[{i}]={tool!r} to a tool schema: {exc!r}") from exc
        function = schema.get("function") if isinstance(schema, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(
                f"tools[{i}]={tool!r} has no tool name: a tool dict needs a non-empty 'name' "
                "(or {'type': 'function', 'function': {'name': ..., 'parameters': ...}})")
        problem = schema_problem(function.get("parameters", {}))
        if problem:
            raise InvalidRequestError(f"tools[{i}] ({name!r}): {problem}")
        converted.append(schema)
    return converted


def tool_names_of(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of OpenAI-format tool dicts."""
    return [t["function"]["name"] for t in tools]


def has_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render template messages to the prompt text, ending with the assistant turn opener.

    If the template rejects the conversation (e.g. roles must alternate), it is tried once
    more with neighbouring messages of one role merged.

    Raises:
        ChatTemplateError: No chat template, or the template rejected the conversation.
    """
    if not has_chat_template(tokenizer):
        raise ChatTemplateError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'this model')!r} has no chat "
            f"template (a base model, or a GGUF file without tokenizer.chat_template): "
            f"{HOW_TO_SET}, or use an instruct/chat model"
        )
    kwargs = dict(template_kwargs or {})
    attempts = [messages]
    merged = merge_consecutive_roles(messages)
    if merged != messages:
        attempts.append(merged)
    last_error: Exception | None = None
    for attempt in attempts:
        try:
            prompt = tokenizer.apply_chat_template(
                attempt,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # jinja2 TemplateError, raise_exception() in templates
            last_error = exc
            continue
        if not isinstance(prompt, str):
            raise ChatTemplateError(f"chat template returned {type(prompt).__name__}, not text")
        return prompt
    raise ChatTemplateError(f"the chat template rejected the conversation: {last_error}") from (
        last_error
    )
