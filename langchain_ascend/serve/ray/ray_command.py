"""``langchain-ascend serve --ray``: the same server as a Ray Serve application.

The serve command's options go to every replica unchanged (each replica builds the app
exactly as ``langchain-ascend serve`` would, through
``langchain_ascend.serve.serve_command:app_from_argv``); the options here say how many replicas
and with what resources. Ray is imported only when ``--ray`` is given.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from typing import Any

from langchain_ascend.errors import MissingExtraError
from langchain_ascend.serve.ray import MISSING_EXTRA

__all__ = ["APP_NAME", "REPLICA_BUILDER", "actor_options", "add_ray_options", "replica_argv",
           "run_ray"]

APP_NAME = "langchain-ascend"
REPLICA_BUILDER = "langchain_ascend.serve.serve_command:app_from_argv"
# option -> whether it takes a value (stripped from what the replicas parse)
_RAY_OPTIONS = {"--ray": False, "--replicas": True, "--ray-address": True,
                "--replica-cpus": True, "--replica-npus": True, "--replica-gpus": True}


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    """The ``--ray`` options of ``langchain-ascend serve``."""
    group = parser.add_argument_group("Ray Serve (the 'ray' extra; see docs/ray.md)")
    group.add_argument("--ray", action="store_true", help="serve as a Ray Serve application: "
                       "N engine replicas, each agent routed to the replica holding its prefix")
    group.add_argument("--replicas", type=int, default=1, help="engine replicas (default 1)")
    group.add_argument("--ray-address", default=None, help="Ray cluster to join ('auto': the "
                       "one `ray start` runs here; default: a new local instance)")
    group.add_argument("--replica-cpus", type=float, default=1.0,
                       help="CPUs Ray reserves per replica (default 1)")
    group.add_argument("--replica-npus", type=float, default=0.0, help="Ascend NPUs per "
                       "replica (the custom resource 'NPU' of `ray start --resources`)")
    group.add_argument("--replica-gpus", type=float, default=0.0,
                       help="CUDA GPUs per replica")


def replica_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the Ray options (what each replica's serve parser is given).

    >>> replica_argv(["--model", "m", "--ray", "--replicas", "2", "--replica-cpus=4"])
    ['--model', 'm']
    """
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _RAY_OPTIONS:
            skip = _RAY_OPTIONS[name] and "=" not in arg
            continue
        out.append(arg)
    return out


def actor_options(args: argparse.Namespace) -> dict[str, Any]:
    """Each replica's ``ray_actor_options`` from the ``--replica-*`` options."""
    options: dict[str, Any] = {"num_cpus": args.replica_cpus}
    if args.replica_gpus:
        options["num_gpus"] = args.replica_gpus
    if args.replica_npus:
        options["resources"] = {"NPU": args.replica_npus}
    return options


def _wait_for_signal() -> None:
    """Block until SIGTERM or SIGINT."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_ray(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Start (or join) Ray, run the application until SIGTERM / Ctrl-C, then tear it down."""
    try:
        import ray
        from ray import serve
    except ImportError as error:
        raise MissingExtraError(f"--ray: {MISSING_EXTRA} ({error})") from error
    from langchain_ascend.serve.ray.ray_app import build_ray_app

    app = build_ray_app(app_builder=REPLICA_BUILDER, app_kwargs={"argv": replica_argv(argv)},
                        replicas=args.replicas, ray_actor_options=actor_options(args),
                        max_body_bytes=args.max_body_bytes)
    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name=APP_NAME, route_prefix="/")
    print(f"serving on Ray: {args.replicas} replica(s) at http://{args.host}:{args.port}/v1 "
          f"(health of every replica: /health, metrics by replica: /metrics)", flush=True)
    try:
        _wait_for_signal()
    finally:
        serve.shutdown()  # deletes the application: replicas finish in-flight requests first
        ray.shutdown()
    return 0
