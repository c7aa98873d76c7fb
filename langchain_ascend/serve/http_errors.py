"""OpenAI error objects (``{"error": {"message", "type", "param", "code"}}``) and the
exception handlers that turn every failure into one.

* a body that is not JSON, or that fails the request model (wrong type, out of range, an
  unknown field) -> 400 naming the field in ``param`` (never FastAPI's 422);
* the chat model's typed errors (:mod:`langchain_ascend.errors`) -> 400 (bad request,
  prompt over the context), 503 (engine closed), 500 (a failed step);
* :class:`APIError` raised by the routes (unknown model 404, auth 401, queue full 429...).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from langchain_ascend.errors import (
    ChatTemplateError,
    EngineClosedError,
    ForcedOutputError,
    InvalidRequestError,
    LangChainAscendError,
    PromptTooLongError,
    UnsupportedContentError,
)
from langchain_ascend.serve.web import (
    FastAPI,
    JSONResponse,
    Request,
    RequestValidationError,
    StarletteHTTPException,
)

logger = logging.getLogger(__name__)

_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")
# Request fields whose name may open a typed error's message ("max_tokens must be ...").
_REQUEST_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "tool_choice",
                   "response_format", "tools", "parallel_tool_calls", "messages")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "service_unavailable_error"}


class APIError(Exception):
    """An error answered as OpenAI's error object.

    Args:
        status: The HTTP status.
        message: What is wrong, for a person.
        param: The request field at fault (``"messages[2].tool_call_id"``), or None.
        code: A short machine-readable code (``"model_not_found"``), or None.
        headers: Extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = _ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500
                                        else "server_error")  # 405, 415...: the client's
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code),
                        status_code=error.status, headers=error.headers)


def param_of(loc: Sequence[Any]) -> str | None:
    """The dotted field path of a pydantic error location: ``("body", "messages", 0,
    "content")`` -> ``"messages[0].content"``; union branch labels (``"literal[...]"``,
    ``"NamedToolChoice"``, ``"str"``) end the path."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and _FIELD.match(part) and part not in _TYPE_NAMES:
            path += f".{part}" if path else part
        else:
            break
    return path or None


def validation_error(errors: Sequence[dict[str, Any]]) -> APIError:
    """The 400 of a failed request model: the first error's field, every error's text."""
    if not errors:
        return APIError(400, "invalid request body", code="invalid_request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}",
                        code="invalid_json")
    if first.get("type") == "model_attributes_type" and tuple(first.get("loc", ())) == ("body",):
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    details = []
    for error in errors[:5]:
        where = param_of(error.get("loc", ())) or "body"
        text = ("is not a supported parameter" if error.get("type") == "extra_forbidden"
                else error.get("msg", "is invalid"))
        details.append(f"{where}: {text}")
    code = ("unsupported_parameter" if first.get("type") == "extra_forbidden"
            else "invalid_value")
    return APIError(400, "; ".join(details), param=param_of(first.get("loc", ())), code=code)


def request_field_of(message: str) -> str | None:
    """The request field a typed error's message opens with, if any."""
    for name in _REQUEST_FIELDS:
        if message.startswith(name) or message.startswith(f"the {name}"):
            return name
    return None


def from_typed_error(error: Exception) -> APIError:
    """The OpenAI error of an exception raised while serving a request."""
    message = str(error)
    if isinstance(error, APIError):
        return error
    if isinstance(error, PromptTooLongError):
        return APIError(400, message, param=request_field_of(message) or "messages",
                        code="context_length_exceeded")
    if isinstance(error, UnsupportedContentError):
        return APIError(400, message, param="messages", code="unsupported_content")
    if isinstance(error, InvalidRequestError):
        field = request_field_of(message) or ("tool_choice" if "tool_choice" in message
                                              else None)
        return APIError(400, message, param=field, code="invalid_value")
    if isinstance(error, ChatTemplateError):
        return APIError(400, message, param="messages", code="chat_template_error")
    if isinstance(error, EngineClosedError):
        return APIError(503, message, code="engine_unavailable")
    if isinstance(error, ForcedOutputError):
        return APIError(500, message, code="forced_output_error")
    logger.exception("request failed", exc_info=error)
    return APIError(500, f"internal error: {type(error).__name__}: {message}",
                    code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of ``app`` as an OpenAI error object."""

    async def on_api_error(request: Request, error: Exception) -> JSONResponse:
        return error_response(from_typed_error(error))

    async def on_validation(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return error_response(validation_error(list(error.errors())))

    async def on_http(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        return error_response(APIError(error.status_code, str(error.detail),
                                       headers=dict(error.headers or {})))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(LangChainAscendError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_api_error)
