"""The front deployment: the application's HTTP entry, in front of the engine replicas.

A plain deployment whose ``__call__`` takes Ray's Starlette ``Request`` (Ray Serve allows one
``@serve.ingress`` deployment per application, and that one is the engine replica, which runs
the server's FastAPI app).

It reads each request (it must: the routing key is in the body), computes its routing key
(:func:`~langchain_ascend.serve.ray.routing.routing_key`) and calls the engine deployment's
``forward`` through a handle, passing the key; the engine deployment's router
(:class:`~langchain_ascend.serve.ray.router.PrefixAffinityRouter`) picks the replica. The
reply streams back unchanged: the server's status, headers and body (server-sent events as
they come).

A replica that dies: a request that had not started its reply is retried once on another
replica (nothing reached the client, and a completion has no side effect); one that had
started ends with a clear error — a 503 OpenAI error object, or for a stream an ``error``
event before the stream closes. Nothing waits forever: Ray reports a dead actor to the caller.

``GET /health`` asks every replica (200 only when every one answers 200); ``GET /metrics``
merges every replica's metrics, each sample labelled ``replica``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from langchain_ascend.serve.ray.asgi_call import ForwardedRequest, ResponseStart
from langchain_ascend.serve.ray.merge import health_summary, merge_metrics
from langchain_ascend.serve.ray.routing import routing_key

__all__ = ["FrontDeployment", "error_json"]

logger = logging.getLogger(__name__)

_REPLICA_LOST = (RayActorError, RayServeException)
_HOP_HEADERS = frozenset({b"content-length", b"transfer-encoding", b"connection"})
BROADCAST_TIMEOUT_S = 10.0


def error_json(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = "service_unavailable_error" if status == 503 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None  # the replica's app answers the 400


def _is_stream(start: ResponseStart) -> bool:
    return (start.header("content-type") or "").startswith("text/event-stream")


def _lost(error: BaseException) -> str:
    return (f"the engine replica serving this request stopped ({type(error).__name__}); "
            "Ray Serve is restarting it — retry the request")


@serve.deployment(name="AscendFront")
class FrontDeployment:
    """The HTTP ingress (see the module docstring).

    Args:
        engine: Handle to the engine deployment (bound by ``build_ray_app``).
        max_body_bytes: Largest request body the front reads (413 beyond).
    """

    def __init__(self, engine: DeploymentHandle, max_body_bytes: int = 8 * 1024 * 1024):
        self.engine = engine
        self.max_body_bytes = max_body_bytes

    async def __call__(self, request: Request) -> Response:
        """Ray's HTTP entry: the front's own ``/health`` and ``/metrics``, else relay."""
        if request.method == "GET" and request.url.path == "/health":
            return await self.health(request)
        if request.method == "GET" and request.url.path == "/metrics":
            return await self.metrics(request)
        return await self.relay(request)

    async def relay(self, request: Request) -> Response:
        """Forward one request to the replica its routing key picks."""
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return JSONResponse(error_json(413, f"request body over {self.max_body_bytes} "
                                           "bytes", "body_too_large"), status_code=413)
        forwarded = ForwardedRequest(
            method=request.method, path=request.url.path,
            query_string=request.scope.get("query_string", b""),
            headers=list(request.scope.get("headers", [])), body=body,
            client=(str(request.client.host), int(request.client.port))
            if request.client else None)
        key = routing_key(_json_or_none(body), request.headers)
        for attempt in (1, 2):
            stream: Any = self.engine.options(stream=True).forward.remote(
                forwarded, routing_key=key)
            try:
                start = await stream.__anext__()
                if not isinstance(start, ResponseStart):
                    raise RuntimeError(f"the replica answered {type(start).__name__} first")
                if _is_stream(start):
                    return StreamingResponse(self._rest(stream), status_code=start.status,
                                             headers=self._headers(start))
                rest = b"".join([chunk async for chunk in stream])
                return Response(rest, status_code=start.status, headers=self._headers(start))
            except _REPLICA_LOST as error:
                stream.cancel()
                logger.warning("replica lost on attempt %d of %s %s: %r", attempt,
                               request.method, request.url.path, error)
                last = error
        return JSONResponse(error_json(503, _lost(last), "replica_unavailable"),
                            status_code=503, headers={"Retry-After": "1"})

    @staticmethod
    def _headers(start: ResponseStart) -> dict[str, str]:
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in start.headers
                if k.lower() not in _HOP_HEADERS}

    @staticmethod
    async def _rest(stream: Any) -> AsyncIterator[bytes]:
        """The body chunks of a started stream; a lost replica ends it with an error event."""
        try:
            async for chunk in stream:
                yield chunk
        except _REPLICA_LOST as error:
            event = error_json(503, _lost(error), "replica_unavailable")
            yield f"data: {json.dumps(event)}\n\n".encode()
        finally:
            stream.cancel()  # the client left (or the stream ended): stop the replica's work

    async def health(self, request: Request) -> JSONResponse:
        """200 when every replica's ``GET /health`` answers 200, else 503 naming each."""
        results = await self._ask_all("/health")
        status, body = health_summary({rid: res if isinstance(res, BaseException) else res[0]
                                       for rid, res in results.items()})
        return JSONResponse(body, status_code=status)

    async def metrics(self, request: Request) -> Response:
        """Every replica's Prometheus metrics, each sample labelled ``replica``."""
        results = await self._ask_all("/metrics")
        texts = {rid: res[1] for rid, res in results.items()
                 if not isinstance(res, BaseException) and res[0] == 200}
        return Response(merge_metrics(texts), media_type="text/plain; version=0.0.4")

    async def _ask_all(self, path: str) -> dict[str, Any]:
        """Replica id -> ``(status, text)`` of ``GET path`` on every replica (or the error)."""
        try:
            answers = await self.engine.broadcast("probe", path).results_async(
                timeout_s=BROADCAST_TIMEOUT_S, return_exceptions=True)
        except (TimeoutError, *_REPLICA_LOST) as error:  # none deployed yet, or none answers
            return {"(engine)": error}
        results: dict[str, Any] = {}
        for index, answer in enumerate(answers):
            if isinstance(answer, BaseException):
                results[f"(replica {index})"] = answer
            else:
                rid, status, text = answer
                results[rid] = (status, text)
        return results
