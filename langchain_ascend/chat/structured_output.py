"""``with_structured_output``: a schema -> the bound chat model and the parser of its reply.

``"json_schema"`` binds a ``response_format`` whose grammar constrains the reply to the schema,
``"json_mode"`` one for any JSON object, ``"function_calling"`` a forced call of a tool with
that schema (``tool_choice`` = its name). ``include_raw`` returns ``{"raw", "parsed",
"parsing_error"}`` as LangChain's partner models do. No torch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from operator import itemgetter
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.runnables import (
    Runnable,
    RunnableGenerator,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.utils.pydantic import is_basemodel_subclass

from langchain_ascend.chat.tool_schemas import arguments_like, json_schema, openai_tool
from langchain_ascend.errors import InvalidRequestError

METHODS = ("json_schema", "function_calling", "json_mode")


def _refuse_cut(message: BaseMessage) -> BaseMessage:
    """``message``, unless it is a reply ``max_tokens`` cut or shaped (its
    ``response_metadata["output_error"]``, ``chat.results``): no value is parsed from it, as
    ChatOpenAI parses none from a reply that ended on the length.

    Raises:
        OutputParserException: Carrying the cut note and the reply text.
    """
    error = message.response_metadata.get("output_error")
    if error:
        raise OutputParserException(error, llm_output=str(message.content))
    return message


def _uncut(messages: Iterator[BaseMessage]) -> Iterator[BaseMessage]:
    """Stream the reply's chunks through :func:`_refuse_cut` (the note is on the last)."""
    for message in messages:
        yield _refuse_cut(message)


async def _auncut(messages: AsyncIterator[BaseMessage]) -> AsyncIterator[BaseMessage]:
    async for message in messages:
        yield _refuse_cut(message)


def _schema_of(schema: dict[str, Any] | type) -> dict[str, Any]:
    """``schema`` as a JSON schema.

    Raises:
        InvalidRequestError: It is no schema (langchain raises ValueError / TypeError).
    """
    try:
        return json_schema(schema)
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequestError(
            f"with_structured_output: {schema!r} is not a schema (a pydantic class, a "
            f"TypedDict, a JSON schema dict or an OpenAI tool dict): {exc}") from exc


def _bound_and_parser(chat: Any, schema: dict[str, Any] | type | None, method: str,
                      ls_format: dict[str, Any]) -> tuple[Runnable, Runnable]:
    """The bound chat model and the reply's parser for ``method``."""
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    json_schema = ls_format["schema"] or {}
    if method == "function_calling":
        if not arguments_like(json_schema):
            raise InvalidRequestError(
                "method='function_calling' needs an object schema (a tool's arguments are an "
                f"object); this one's root is {json_schema.get('type') or 'not an object'}: use "
                "method='json_schema'")
        tool_name = openai_tool(schema)["function"]["name"]
        bound = chat.bind_tools([schema], tool_choice=tool_name, parallel_tool_calls=False,
                                ls_structured_output_format=ls_format)
        parser: Runnable = (
            PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
            if is_pydantic else JsonOutputKeyToolsParser(key_name=tool_name,
                                                         first_tool_only=True))
        return bound, parser
    if method == "json_schema":
        response_format: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": json_schema.get("title", "output"), "schema": json_schema},
        }
    else:
        response_format = {"type": "json_object"}
    bound = chat.bind(response_format=response_format, ls_structured_output_format=ls_format)
    parser = (PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
              if is_pydantic else JsonOutputParser())
    return bound, parser


def structured_output(chat: Any, schema: dict[str, Any] | type | None, *, method: str,
                      include_raw: bool, strict: bool | None,
                      kwargs: dict[str, Any]) -> Runnable:
    """The runnable ``chat.with_structured_output(schema, ...)`` returns.

    Raises:
        InvalidRequestError: An unknown ``method``, an unsupported keyword argument, no
            ``schema`` where the method needs one, or a ``schema`` that is none.
    """
    if kwargs:
        raise InvalidRequestError(f"unsupported with_structured_output arguments {sorted(kwargs)}")
    if method not in METHODS:
        raise InvalidRequestError(
            f"unknown method {method!r}: use 'json_schema', 'function_calling' or 'json_mode'")
    if schema is None and method != "json_mode":
        raise InvalidRequestError(
            f"with_structured_output(method={method!r}) needs a schema; only "
            "method='json_mode' takes none (any JSON object, returned as a dict)")
    ls_format = {"kwargs": {"method": method, "strict": strict},
                 "schema": None if schema is None else _schema_of(schema)}
    bound, parser = _bound_and_parser(chat, schema, method, ls_format)
    parser = RunnableGenerator(_uncut, _auncut) | parser
    if not include_raw:
        return bound | parser
    parser_assign = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
    with_fallback = parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")
    return RunnableMap(raw=bound) | with_fallback
