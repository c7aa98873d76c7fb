"""The engine replica: one process, one engine, the server's FastAPI app — as a Ray Serve
deployment.

Each replica builds the server's app (:func:`langchain_ascend.serve.app.create_app`, the same
app ``langchain-ascend serve`` runs under uvicorn) at replica start, with
``@serve.ingress`` late-bound (``__serve_build_asgi_app__``), so Ray runs its lifespan and the
app object is this replica's own, never pickled from the driver. The model loads and warms up
before the replica reports ready.

The front deployment calls :meth:`EngineReplica.forward` through a handle whose router picks
the replica holding the request's prefix (:mod:`langchain_ascend.serve.ray.router`); the
request runs through the app in-process (:func:`~langchain_ascend.serve.ray.asgi_call
.call_asgi`) and streams back. Every response carries ``X-Replica-Id``.

Ray's health checks call :meth:`EngineReplica.check_health`, which asks the app's own
``GET /health`` (200 while the engine serves): a replica whose engine failed is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import ray
from ray import serve

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.serve.app import create_app
from langchain_ascend.serve.ray.asgi_call import ForwardedRequest, ResponseStart, call_asgi
from langchain_ascend.serve.ray.replica_metrics import ReplicaMetrics

__all__ = ["REPLICA_HEADER", "EngineReplica", "build_server_app", "resolve_builder"]

logger = logging.getLogger(__name__)

REPLICA_HEADER = "x-replica-id"
"""Response header naming the replica that answered (its Ray Serve replica id)."""

METRICS_PERIOD_S = 5.0


def build_server_app(model: str, chat_model_kwargs: Mapping[str, Any] | None = None,
                     **server_kwargs: Any) -> Any:
    """The server's app over a new ``AscendChatModel(model=model, **chat_model_kwargs)``.

    The engine is built (model loaded, warm-up run) before this returns, so a replica is
    ready only once it can serve.
    """
    chat_model = AscendChatModel(model=model, **dict(chat_model_kwargs or {}))
    chat_model.warm_up()
    return create_app(chat_model, **server_kwargs)


def resolve_builder(builder: str | Callable[..., Any]) -> Callable[..., Any]:
    """A builder given as ``"package.module:function"`` (or a callable) as a callable."""
    if callable(builder):
        return builder
    module_name, _, attr = str(builder).partition(":")
    if not module_name or not attr:
        raise ValueError(f"app_builder must be 'package.module:function', got {builder!r}")
    return getattr(importlib.import_module(module_name), attr)


async def _get(app: Any, path: str) -> tuple[int, bytes]:
    """Status and body of ``GET path`` on ``app``, in-process."""
    status, chunks = 0, []
    async for item in call_asgi(app, ForwardedRequest("GET", path)):
        if isinstance(item, ResponseStart):
            status = item.status
        else:
            chunks.append(item)
    return status, b"".join(chunks)


@serve.deployment(name="AscendEngine")
@serve.ingress()
class EngineReplica:
    """One engine replica (see the module docstring).

    Args:
        app_builder: Builds the ASGI app (``"module:function"`` or a callable);
            :func:`build_server_app` by default.
        app_kwargs: Its keyword arguments (``model=``, ``chat_model_kwargs=``, the server's).
    """

    app: Any  # the built ASGI app: Ray's ingress wrapper provides it (late-bound)

    def __init__(self, app_builder: str | Callable[..., Any] = build_server_app,
                 app_kwargs: Mapping[str, Any] | None = None) -> None:
        self.builder = resolve_builder(app_builder)
        self.app_kwargs = dict(app_kwargs or {})
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.metrics = ReplicaMetrics()
        self.metrics_task: asyncio.Task | None = None

    def __serve_build_asgi_app__(self) -> Any:
        return self.builder(**self.app_kwargs)

    def _start_metrics(self) -> None:
        if self.metrics_task is None:
            self.metrics_task = asyncio.get_running_loop().create_task(self._mirror_metrics())

    async def _mirror_metrics(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a failed scrape waits for the next round
                status, body = await _get(self.app, "/metrics")
                if status == 200:
                    self.metrics.mirror(body.decode("utf-8", "replace"))
            await asyncio.sleep(METRICS_PERIOD_S)

    async def forward(self, request: ForwardedRequest,
                      routing_key: str | None = None) -> AsyncIterator[ResponseStart | bytes]:
        """Run ``request`` through this replica's app; yields the start, then body chunks.

        ``routing_key`` is read by the router only (it chose this replica by it).
        """
        self._start_metrics()
        began, status = time.monotonic(), 0
        try:
            async for item in call_asgi(self.app, request):
                if isinstance(item, ResponseStart):
                    status = item.status
                    item = ResponseStart(item.status, [
                        *item.headers, (REPLICA_HEADER.encode(), self.replica_id.encode())])
                yield item
        except Exception:
            self.metrics.failures.inc()
            raise
        finally:
            if status:
                self.metrics.requests.inc(tags={"status": str(status)})
            self.metrics.latency.observe(time.monotonic() - began)

    async def check_health(self) -> None:
        """Ray's health check: the app's ``GET /health`` must answer 200."""
        self._start_metrics()
        status, body = await _get(self.app, "/health")
        if status != 200:
            raise RuntimeError(f"replica {self.replica_id}: GET /health answered {status}: "
                               f"{body[:200].decode('utf-8', 'replace')}")

    async def probe(self, path: str) -> tuple[str, int, str]:
        """``(replica id, status, body text)`` of ``GET path`` on this replica's app (the
        front's ``/health`` and ``/metrics`` ask every replica through this)."""
        status, body = await _get(self.app, path)
        return self.replica_id, status, body.decode("utf-8", "replace")

    def whoami(self) -> tuple[str, str | None]:
        """``(replica id, Ray actor name)`` of this replica (tests and tooling: the actor name
        is what ``ray.get_actor(name, namespace="serve")`` finds, e.g. to kill it)."""
        return self.replica_id, ray.get_runtime_context().get_actor_name()
