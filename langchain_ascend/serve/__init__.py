"""``langchain-ascend serve``: an OpenAI-compatible server over one shared engine.

``create_app(chat_model, ...)`` builds the FastAPI app (mount it, or run it with uvicorn);
``langchain-ascend serve --model ...`` loads and warms the model, then serves it. Routes:
``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``, ``POST /v1/agent``,
``GET /health``, ``GET /metrics``, ``/docs``. Needs the ``serve`` extra
(``pip install 'langchain-ascend[serve]'``); without it importing this package raises an
``ImportError`` that says so.

Modules, one job each: ``web`` (the web stack's imports), ``openai_types`` (request models),
``convert`` (requests -> LangChain), ``responses`` (LangChain -> OpenAI objects and chunks),
``sse``, ``http_errors`` (OpenAI error objects), ``admission`` (the bounded queue), ``middleware``
(auth, body limit, request counts), ``metrics``, ``state``, ``chat_route`` / ``info_routes``
/ ``agent_route``, ``app`` (``create_app``), ``serve_command`` (the command).
"""

from __future__ import annotations

from langchain_ascend.serve.app import create_app

__all__ = ["create_app"]
