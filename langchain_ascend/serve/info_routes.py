"""``GET /v1/models`` (and ``/v1/models/{id}``), ``GET`` / ``HEAD /health``, ``GET /metrics``
and ``POST /v1/embeddings``."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from langchain_ascend.serve.http_errors import APIError
from langchain_ascend.serve.openai_types import EmbeddingRequest
from langchain_ascend.serve.state import ServerState
from langchain_ascend.serve.web import FastAPI, JSONResponse, Response


def add_info_routes(app: FastAPI, state: ServerState) -> None:
    """Register the model list, health, metrics and embeddings routes on ``app``."""

    @app.get("/v1/models", tags=["openai"], summary="Served models (OpenAI)")
    async def list_models() -> dict[str, Any]:
        return {"object": "list",
                "data": [{"id": name, "object": "model", "created": state.created,
                          "owned_by": "langchain-ascend"} for name in state.model_ids()]}

    @app.get("/v1/models/{model:path}", tags=["openai"],  # ids such as "org/name"
             summary="One served model (OpenAI)")
    async def retrieve_model(model: str) -> dict[str, Any]:
        if model not in state.model_ids():
            raise APIError(404, f"the model {model!r} does not exist here; this server serves "
                           f"{state.model_ids()}", param="model", code="model_not_found")
        return {"id": model, "object": "model", "created": state.created,
                "owned_by": "langchain-ascend"}

    @app.api_route("/health", methods=["GET", "HEAD"], tags=["server"],
                   summary="200 while the engine serves, else 503")
    async def health() -> JSONResponse:
        stats = state.engine_stats()
        if stats is None or getattr(app.state, "draining", False):
            reason = "draining" if stats is not None else "the engine cannot serve"
            return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ok", "model": state.served_model_name,
                             "running": stats.num_running, "waiting": stats.num_waiting,
                             "kv_blocks_used": stats.num_blocks_used,
                             "kv_blocks_total": stats.num_blocks_total})

    @app.get("/metrics", tags=["server"], summary="Prometheus metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/embeddings", tags=["openai"], summary="Embeddings (OpenAI)")
    async def embeddings(body: EmbeddingRequest) -> JSONResponse:
        if state.embeddings is None or body.model != state.embeddings_name:
            served = state.embeddings_name or "none"
            raise APIError(404, f"the embedding model {body.model!r} does not exist here "
                           f"(served: {served})", param="model", code="model_not_found")
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        vectors = await state.embeddings.aembed_documents(texts)
        if body.dimensions is not None and body.dimensions != len(vectors[0]):
            raise APIError(400, f"dimensions={body.dimensions}, but {body.model!r} makes "
                           f"vectors of {len(vectors[0])}", param="dimensions",
                           code="invalid_value")
        num_tokens = await asyncio.to_thread(count_tokens, state.embeddings, texts)
        data = [{"object": "embedding", "index": i,
                 "embedding": encode(vector, body.encoding_format or "float")}
                for i, vector in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": body.model,
                             "usage": {"prompt_tokens": num_tokens,
                                       "total_tokens": num_tokens}})


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what the SDK asks for)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def count_tokens(embeddings: Any, texts: list[str]) -> int:
    """Tokens of ``texts`` the embedding model reads, in its tokenizer (special tokens
    included): a text longer than its ``max_seq_length`` counts the tokens it keeps (the
    rest were never embedded)."""
    tokenizer = embeddings.client.tokenizer
    limit = getattr(embeddings.client, "max_seq_length", None)
    if limit:
        encoded = tokenizer(texts, truncation=True, max_length=int(limit))
    else:
        encoded = tokenizer(texts)
    return sum(len(ids) for ids in encoded["input_ids"])
