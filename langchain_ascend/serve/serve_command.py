"""``langchain-ascend serve``: load and warm the model, then serve the OpenAI-compatible app.

The port opens only once the model is loaded, its KV cache allocated and one request run
(progress bars as the demo's). SIGTERM or Ctrl-C: uvicorn stops accepting connections,
lets in-flight requests finish for up to ``--graceful-timeout`` seconds, then the process
exits 0.
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import signal
import socket
import sys
from typing import Any

from langchain_ascend.app.stage_times import stages
from langchain_ascend.chat.checks import BUDGET_CLOSED
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.config import load_agent_config, read_config
from langchain_ascend.embeddings import AscendEmbeddings
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.serve.app import create_app
from langchain_ascend.serve.ray.ray_command import add_ray_options, run_ray
from langchain_ascend.serve.web import uvicorn
from langchain_ascend.validation import (
    canonical_dtype,
    check_count,
    check_device,
    check_dtype,
    check_int,
)

API_KEY_ENV = "LANGCHAIN_ASCEND_API_KEY"
DESCRIPTION = ("serve a model over an OpenAI-compatible HTTP API (chat completions, "
               "embeddings, models, the agent of --config), one shared engine for all clients")


def build_parser() -> argparse.ArgumentParser:
    """The command's options (``langchain-ascend serve --help``)."""
    p = argparse.ArgumentParser(prog="langchain-ascend serve", description=DESCRIPTION)
    p.add_argument("--model", help="the chat model: an HF folder, a .gguf file, or a hub id "
                   "in the local cache (default: the --config file's model.path)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, "
                   "this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    p.add_argument("--device", default="auto", help="auto | npu[:N] | cuda[:N] | cpu")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--quantization", default="auto",
                   choices=["auto", "gguf", "int8", "int4", "none"],
                   help="how the weights are held (see AscendChatModel.quantization)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   choices=["auto", "float32", "bfloat16", "float16"],
                   help="what the KV cache stores (see AscendChatModel.kv_cache_dtype)")
    p.add_argument("--budget-closed-output", choices=BUDGET_CLOSED, default=None,
                   help="a forced call or structured output closed early to fit max_tokens: "
                   "cut (finish_reason length, the default) or complete "
                   "(see AscendChatModel.budget_closed_output)")
    p.add_argument("--served-model-name", help="the model id clients send (default: the "
                   "model's file or folder name)")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1 routes "
                   f"(default: ${API_KEY_ENV}; unset: no key)")
    p.add_argument("--config", help="agent_config.yaml: builds the chat model and the agent "
                   "of POST /v1/agent (tools by import path under tools.imports)")
    p.add_argument("--max-waiting", type=int, default=256, help="requests queued beyond the "
                   "engine's batch before new ones get 429 (default 256)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="requests decoded together (default: the chat model's, 64)")
    p.add_argument("--max-context-length", type=int, default=None,
                   help="most tokens per request (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="default reply budget when a request sets none")
    p.add_argument("--embeddings-model", help="the /v1/embeddings model (default: the "
                   "config's, else the bundled all-MiniLM-L6-v2)")
    p.add_argument("--no-embeddings", action="store_true", help="serve no /v1/embeddings")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="largest request body (default 8 MiB; 413 beyond)")
    p.add_argument("--graceful-timeout", type=int, default=30,
                   help="seconds in-flight requests get to finish after SIGTERM (default 30)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    add_ray_options(p)
    return p


def port_number(text: str) -> int:
    """``--port``: an integer in 0..65535 (uvicorn bound 99999 as 34463, its value mod 2**16)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: use 0..65535")
    return port


def check_options(args: argparse.Namespace) -> None:
    """What can fail without the model, checked before it loads (seconds to minutes):
    ``--device``, ``--dtype``, the counts, and that ``--host``:``--port`` can be bound.

    Raises:
        InvalidRequestError: Naming the option (the CLI prints it as one line, exit 2).
    """
    check_device(args.device)
    check_dtype(args.dtype)
    check_int("--max-waiting", args.max_waiting, minimum=0)
    check_count("--max-body-bytes", args.max_body_bytes)
    check_int("--graceful-timeout", args.graceful_timeout, minimum=0)
    for name in ("max_batch_size", "max_context_length", "max_tokens"):
        check_count(f"--{name.replace('_', '-')}", getattr(args, name), allow_none=True)
    try:
        family = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((args.host, args.port))
    except OSError as exc:
        reason = ("it is in use" if exc.errno == errno.EADDRINUSE
                  else exc.strerror or str(exc))
        raise InvalidRequestError(
            f"cannot serve on {args.host}:{args.port}: {reason} (--host / --port)") from None


def chat_model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``AscendChatModel`` arguments of the options given."""
    kwargs: dict[str, Any] = {"model": args.model, "device": args.device, "dtype": args.dtype,
                              "quantization": args.quantization,
                              "kv_cache_dtype": args.kv_cache_dtype}
    for name in ("max_batch_size", "max_context_length", "max_tokens", "budget_closed_output"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    return kwargs


def config_with_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--config`` file's data with the model options given on the command line in its
    ``model`` section (they win over the file, as with ``demo --config``): the agent and the
    chat completions then run on the one chat model the config builds.

    Raises:
        ConfigError: The file is missing or invalid (``read_config``).
    """
    data = read_config(args.config).model_dump(exclude_unset=True, mode="json")
    model = data.setdefault("model", {})
    given = chat_model_kwargs(args)
    if given.pop("model") is not None:
        model["path"] = args.model
    device = given.pop("device").strip().lower()
    given["dtype"] = canonical_dtype(given["dtype"])
    for name, value in given.items():
        if value != "auto" or name not in model:  # "auto": the option's default, not a choice
            model[name] = value
    if device != "auto":
        kind, _, index = device.partition(":")
        npu = data.setdefault("npu", {})
        npu["device"] = kind
        context = npu.setdefault("context", {})
        if index:
            context["device_id"] = int(index)
        else:  # the device as given: the file's index was for another choice
            context.pop("device_id", None)
    return data


def load_parts(args: argparse.Namespace) -> dict[str, Any]:
    """Build and warm the chat model, embeddings and agent (under progress bars)."""
    parts: dict[str, Any] = {"agent": None, "embeddings": None}
    steps = ["config" if args.config else "model", "load, KV cache, warm-up", "embeddings"]
    with stages("serve", steps, enabled=not args.no_progress) as advance:
        if args.config:
            components = load_agent_config(config_with_options(args))
            parts["agent"] = components.agent
            parts["embeddings"] = components.embeddings
            parts["chat_model"] = components.chat_model  # the agent's: one engine for both
        else:
            parts["chat_model"] = AscendChatModel(**chat_model_kwargs(args))
        advance()
        parts["chat_model"].warm_up()
        advance()
        if not args.no_embeddings and (parts["embeddings"] is None or args.embeddings_model):
            kwargs = {"model": args.embeddings_model} if args.embeddings_model else {}
            parts["embeddings"] = AscendEmbeddings(device=args.device, **kwargs)
        if args.no_embeddings:
            parts["embeddings"] = None
        advance()
    return parts


def make_app(args: argparse.Namespace, parts: dict[str, Any]) -> Any:
    """The app over the loaded parts, with the options given."""
    return create_app(parts["chat_model"], embeddings=parts["embeddings"],
                      served_model_name=args.served_model_name,
                      api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                      max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
                      agent=parts["agent"])


def app_from_argv(argv: list[str]) -> Any:
    """The app exactly as ``serve`` builds it from ``argv``, without progress bars (each
    replica of ``serve --ray`` runs this)."""
    args = build_parser().parse_args([*argv, "--no-progress"])
    return make_app(args, load_parts(args))


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM / Ctrl-C; 0 after a clean (drained) shutdown."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.ray:
        return run_ray(args, argv)

    check_options(args)
    parts = load_parts(args)
    app = make_app(args, parts)
    # What loading left (modules, the model, the tokenizer's tables: ~550k objects) lives
    # as long as the server; frozen, a full collection walks only what requests allocate
    # instead of stalling every stream and the engine under the GIL (0.3-0.6 s each, one
    # per 100-client benchmark run, on a loaded 2-core host).
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.graceful_timeout)
    server = uvicorn.Server(config)
    state = app.server_state
    print(f"serving {state.served_model_name!r} at http://{args.host}:{args.port}/v1 "
          f"(docs: /docs)", flush=True)
    # uvicorn drains on SIGTERM, then re-raises it to the handler found before it started:
    # make that one a no-op so a drained shutdown ends in exit status 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    parts["chat_model"].get_engine().shutdown()
    return 0
