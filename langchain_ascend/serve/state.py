"""What every route of one app shares: the chat model (and through it the one engine), the
embeddings, the agent, the served names, the admission queue and the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_ascend.serve.admission import Admission
from langchain_ascend.serve.http_errors import APIError
from langchain_ascend.serve.metrics import ServerMetrics


@dataclass
class ServerState:
    """The app's shared parts.

    Attributes:
        chat_model: The ``AscendChatModel`` every chat request runs on.
        served_model_name: The id clients send as ``model``.
        embeddings: The ``AscendEmbeddings`` of ``/v1/embeddings`` (None: no such route).
        embeddings_name: Its id in ``/v1/models``.
        agent: The agent of ``/v1/agent`` (None without ``--config``).
        admission: The bounded queue.
        metrics: The app's Prometheus metrics.
        created: Unix time the app was built (``/v1/models``'s ``created``).
    """

    chat_model: Any
    served_model_name: str
    embeddings: Any
    embeddings_name: str | None
    agent: Any
    admission: Admission
    metrics: ServerMetrics
    created: int

    @property
    def has_penalties(self) -> bool:
        """The chat model takes OpenAI's ``presence_penalty`` / ``frequency_penalty``."""
        fields = getattr(type(self.chat_model), "model_fields", {})
        return "presence_penalty" in fields and "frequency_penalty" in fields

    def engine(self) -> Any:
        """The chat model's engine (loads the model on first use)."""
        return self.chat_model.get_engine()

    def engine_stats(self) -> Any:
        """The engine's counters, or None when it cannot answer (closed, failed to load)."""
        try:
            engine = self.engine()
            return None if engine.is_closed else engine.stats()
        except Exception:  # a scrape or health check never fails on the engine's account
            return None

    def check_chat_model(self, name: str) -> None:
        """Raises: APIError 404 when ``name`` is not the served chat model."""
        if name != self.served_model_name:
            raise APIError(404, f"the model {name!r} does not exist here; this server serves "
                           f"{self.served_model_name!r} (see GET /v1/models)", param="model",
                           code="model_not_found")

    def model_ids(self) -> list[str]:
        names = [self.served_model_name]
        if self.embeddings is not None and self.embeddings_name:
            names.append(self.embeddings_name)
        return names
