"""``create_app``: the OpenAI-compatible FastAPI app over one ``AscendChatModel``.

Every request of every client runs on the chat model's one engine, so concurrent requests
are batched continuously and share the prefix cache (a second client with the same system
prompt gets ``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from langchain_ascend.embeddings import HUB_MINILM, default_model
from langchain_ascend.serve.admission import Admission
from langchain_ascend.serve.agent_route import add_agent_route
from langchain_ascend.serve.chat_route import add_chat_route
from langchain_ascend.serve.http_errors import install_error_handlers
from langchain_ascend.serve.info_routes import add_info_routes
from langchain_ascend.serve.metrics import ServerMetrics
from langchain_ascend.serve.middleware import ServerMiddleware
from langchain_ascend.serve.state import ServerState
from langchain_ascend.serve.web import FastAPI
from langchain_ascend.validation import check_count, check_int

DEFAULT_MAX_WAITING = 256
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def default_model_name(model: str) -> str:
    """The id a model is served under by default: its file or folder name."""
    path = Path(str(model))
    return path.stem if path.suffix == ".gguf" else path.name or str(model)


def default_embeddings_name(model: str) -> str:
    """The id embeddings are served under by default: ``all-MiniLM-L6-v2`` for the default
    model (the packaged MiniLM's folder is called ``model``), a hub id as given, else the
    folder name."""
    if str(model) == default_model():
        return HUB_MINILM.rsplit("/", 1)[-1]
    path = Path(str(model)).expanduser()
    return default_model_name(str(model)) if path.exists() else str(model)


def create_app(
    chat_model: Any,
    *,
    embeddings: Any = None,
    served_model_name: str | None = None,
    embeddings_model_name: str | None = None,
    api_key: str | None = None,
    max_waiting: int = DEFAULT_MAX_WAITING,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    agent: Any = None,
) -> Any:
    """The server as an ASGI app (run it with uvicorn, or mount it in another app).

    Args:
        chat_model: The ``AscendChatModel`` serving ``/v1/chat/completions``.
        embeddings: An ``AscendEmbeddings`` for ``/v1/embeddings`` (None: the route answers
            404).
        served_model_name: The ``model`` id clients send (default: the model's file or
            folder name).
        embeddings_model_name: The embeddings' id (default: :func:`default_embeddings_name`).
        api_key: When set, every ``/v1`` route needs ``Authorization: Bearer <api_key>``.
        max_waiting: Requests allowed to queue beyond the engine's batch
            (``chat_model.max_batch_size``); one more gets 429 with ``Retry-After``.
        max_body_bytes: Largest request body (413 beyond).
        agent: The runnable of ``/v1/agent`` (``create_ascend_agent``; None: 404).

    Returns:
        The app: FastAPI wrapped in the auth / body-limit / request-count middleware.
        ``app.fastapi`` is the FastAPI app itself, ``app.server_state`` its shared parts.
    """
    check_int("max_waiting", max_waiting, minimum=0)
    check_count("max_body_bytes", max_body_bytes)
    admission = Admission(int(getattr(chat_model, "max_batch_size", 1) or 1), max_waiting)
    state = ServerState(
        chat_model=chat_model,
        served_model_name=served_model_name or default_model_name(chat_model.model),
        embeddings=embeddings,
        embeddings_name=(embeddings_model_name or default_embeddings_name(embeddings.model)
                         if embeddings is not None else None),
        agent=agent,
        admission=admission,
        metrics=ServerMetrics(lambda: state.engine_stats(), lambda: admission.in_flight),
        created=int(time.time()),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.draining = False
        yield
        app.state.draining = True  # uvicorn drained the connections; nothing new comes

    api = FastAPI(title="langchain-ascend", lifespan=lifespan,
                  description="OpenAI-compatible chat completions, embeddings and the "
                  "agent, served by one langchain-ascend engine.")
    api.state.server = state
    install_error_handlers(api)
    add_chat_route(api, state)
    add_info_routes(api, state)
    add_agent_route(api, state)
    wrapped = ServerMiddleware(api, api_key=api_key, max_body_bytes=max_body_bytes,
                               metrics=state.metrics)
    wrapped.fastapi = api  # type: ignore[attr-defined]
    wrapped.server_state = state  # type: ignore[attr-defined]
    return wrapped
