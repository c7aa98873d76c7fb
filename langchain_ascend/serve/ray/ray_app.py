"""``build_ray_app``: the server as a Ray Serve application, agents routed by prefix.

Two deployments:

* ``AscendEngine`` (:class:`~langchain_ascend.serve.ray.replica.EngineReplica`), N replicas
  (or autoscaled): each runs the server's FastAPI app over one engine, with the resources you
  give it (``ray_actor_options={"resources": {"NPU": 1}}`` on Ascend hosts);
* ``AscendFront`` (:class:`~langchain_ascend.serve.ray.front.FrontDeployment`): the HTTP
  ingress; it computes each request's routing key and calls the engine through a handle whose
  router (:class:`~langchain_ascend.serve.ray.router.PrefixAffinityRouter`) sends an agent's
  hops to the replica that holds its prefix, or the least-loaded one when that is saturated.

Why a front deployment and a custom ``RequestRouter``, not routing in Ray's HTTP proxy: the
proxy routes a request before its body is read (its router sees only the ASGI scope), and an
agent's key is in the body (system prompt and first user turn). Ray Serve's LLM stack takes
the same shape (an OpenAI ingress deployment calling engine deployments whose router reads the
request). ``multiplexed`` model ids were the other candidate: they pin a key to the replicas
that "loaded" it, but count keys as models to evict and never fall back by load.

>>> app = build_ray_app(model="/models/qwen", replicas=2)  # doctest: +SKIP
>>> serve.run(app, name="ascend", route_prefix="/")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ray.serve.config import RequestRouterConfig

from langchain_ascend.serve.ray.front import FrontDeployment
from langchain_ascend.serve.ray.replica import EngineReplica, build_server_app
from langchain_ascend.serve.ray.router import PrefixAffinityRouter
from langchain_ascend.validation import check_count

__all__ = ["DEFAULT_MAX_ONGOING_REQUESTS", "ROUTER_CLASS", "build_ray_app", "replica_options"]

ROUTER_CLASS = f"{PrefixAffinityRouter.__module__}.{PrefixAffinityRouter.__qualname__}"
"""The engine deployment's request router, by import path (Ray imports it where handles
route: in the front's replicas)."""

DEFAULT_MAX_ONGOING_REQUESTS = 64
"""Requests Ray sends one replica at a time (the engine batches them; its own queue bound
answers 429 beyond ``max_batch_size + max_waiting``)."""


def replica_options(replicas: int | None, autoscaling_config: Mapping[str, Any] | None,
                     ray_actor_options: Mapping[str, Any] | None, max_ongoing_requests: int,
                     saturation: int | None, health_check_period_s: float,
                     health_check_timeout_s: float) -> dict[str, Any]:
    """The engine deployment's options: replica count or autoscaling, resources, the router."""
    if (replicas is None) == (autoscaling_config is None):
        raise ValueError("give exactly one of replicas=N and autoscaling_config={...}")
    options: dict[str, Any] = {
        "max_ongoing_requests": check_count("max_ongoing_requests", max_ongoing_requests),
        "ray_actor_options": dict(ray_actor_options or {}),
        "health_check_period_s": health_check_period_s,
        "health_check_timeout_s": health_check_timeout_s,
        "request_router_config": RequestRouterConfig(
            request_router_class=ROUTER_CLASS,  # type: ignore[arg-type]
            request_router_kwargs={"saturation": check_count("saturation", saturation,
                                                             allow_none=True)}),
    }
    if replicas is not None:
        options["num_replicas"] = check_count("replicas", replicas)
    else:
        options["autoscaling_config"] = dict(autoscaling_config or {})
    return options


def build_ray_app(
    model: str | None = None,
    *,
    replicas: int | None = None,
    autoscaling_config: Mapping[str, Any] | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
    chat_model_kwargs: Mapping[str, Any] | None = None,
    server_kwargs: Mapping[str, Any] | None = None,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    saturation: int | None = None,
    health_check_period_s: float = 5.0,
    health_check_timeout_s: float = 30.0,
    front_replicas: int = 1,
    max_body_bytes: int | None = None,
    app_builder: str | Callable[..., Any] | None = None,
    app_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """The Ray Serve application: a front and N engine replicas (pass it to ``serve.run``).

    Args:
        model: The model every replica serves (a folder or a ``.gguf`` file, as for
            ``AscendChatModel(model=...)``).
        replicas: A fixed number of engine replicas (default 1 when ``autoscaling_config``
            is not given either).
        autoscaling_config: Ray Serve's autoscaling config instead of ``replicas``
            (``{"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}``).
        ray_actor_options: Each engine replica's resources (``{"num_cpus": 4}``, on Ascend
            ``{"resources": {"NPU": 1}}``, on CUDA ``{"num_gpus": 1}``).
        chat_model_kwargs: ``AscendChatModel`` arguments besides the model (``device``,
            ``dtype``, ``max_batch_size``...).
        server_kwargs: ``create_app`` arguments (``served_model_name``, ``api_key``,
            ``max_waiting``...).
        max_ongoing_requests: Requests Ray sends one replica at a time.
        saturation: In-flight requests at which a key's replica is passed over for the
            least-loaded other (default: ``max_ongoing_requests``).
        health_check_period_s / health_check_timeout_s: Ray's replica health checks (each
            asks the replica's ``GET /health``).
        front_replicas: Replicas of the front deployment.
        max_body_bytes: Largest body the front reads (413 beyond; default: the server's
            ``max_body_bytes`` in ``server_kwargs``, else 8 MiB).
        app_builder: Builds each replica's ASGI app (``"module:function"`` or a function);
            default: the server's app over ``AscendChatModel(model=model, ...)``.
        app_kwargs: The builder's arguments, replacing those made from ``model``,
            ``chat_model_kwargs`` and ``server_kwargs``.
    """
    if app_builder is None and model is None:
        raise ValueError("build_ray_app needs model= (or app_builder= with its app_kwargs=)")
    if replicas is None and autoscaling_config is None:
        replicas = 1
    if app_kwargs is None:
        app_kwargs = {"model": model, "chat_model_kwargs": dict(chat_model_kwargs or {}),
                      **dict(server_kwargs or {})}
    engine = EngineReplica.options(**replica_options(  # type: ignore[attr-defined]
        replicas, autoscaling_config, ray_actor_options, max_ongoing_requests, saturation,
        health_check_period_s, health_check_timeout_s))
    front = FrontDeployment.options(  # type: ignore[attr-defined]
        num_replicas=check_count("front_replicas", front_replicas), max_ongoing_requests=1024)
    if max_body_bytes is None:
        max_body_bytes = dict(server_kwargs or {}).get("max_body_bytes", 8 * 1024 * 1024)
    return front.bind(engine.bind(app_builder or build_server_app, dict(app_kwargs)),
                      max_body_bytes=check_count("max_body_bytes", max_body_bytes))
