"""The ASGI layer in front of every route: API-key check on ``/v1`` routes (constant-time),
the request body size limit (413), and the per-endpoint request counter."""

from __future__ import annotations

import hmac
import json
from typing import Any

from langchain_ascend.serve.http_errors import error_body
from langchain_ascend.serve.metrics import ServerMetrics

Scope = dict[str, Any]


async def send_error(send: Any, status: int, message: str, *, param: str | None = None,
                     code: str | None = None, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message, param, code)).encode()
    raw_headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class ServerMiddleware:
    """Wraps the FastAPI app.

    Args:
        app: The ASGI app.
        api_key: Required as ``Authorization: Bearer <key>`` on ``/v1`` routes; None: open.
        max_body_bytes: Largest request body accepted.
        metrics: Counts each answered request by endpoint and status.
    """

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int,
                 metrics: ServerMetrics) -> None:
        self.app = app
        self.expected = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    def authorized(self, scope: Scope) -> bool:
        if self.expected is None or not scope["path"].startswith("/v1"):
            return True
        scheme, _, given = (header(scope, b"authorization") or b"").strip().partition(b" ")
        # the scheme is case-insensitive (RFC 7235): "bearer KEY" is "Bearer KEY"
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        counted = False

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.metrics.count_request(path, message["status"])
            await send(message)

        if not self.authorized(scope):
            await send_error(counting_send, 401, "invalid or missing API key: send "
                             "'Authorization: Bearer <key>'", code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
            return
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await send_error(counting_send, 413, f"the request body has {int(length)} bytes, "
                             f"more than the limit of {self.max_body_bytes}",
                             code="request_too_large")
            return
        await self.limited(scope, receive, counting_send)

    async def limited(self, scope: Scope, receive: Any, send: Any) -> None:
        """Run the app with a receive that stops a body (chunked, no length) at the limit:
        the app sees a disconnect and the client gets 413."""
        received = 0
        too_large = False
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if too_large:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, guarded_send)
        if too_large and not started:
            await send_error(send, 413, f"the request body is over the limit of "
                             f"{self.max_body_bytes} bytes", code="request_too_large")
