"""The web stack the server runs on (FastAPI, Starlette, uvicorn, prometheus-client), imported
in one place so a missing ``serve`` extra fails once, with the command that installs it.

Every other module of :mod:`langchain_ascend.serve` imports these names from here.
"""

from __future__ import annotations

from langchain_ascend.errors import MissingExtraError
from langchain_ascend.extras import SERVE, install_hint

MISSING_EXTRA = (
    "the OpenAI-compatible server needs FastAPI, uvicorn and prometheus-client: "
    + install_hint(SERVE)
)

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(f"{MISSING_EXTRA} ({error})") from error

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MISSING_EXTRA",
    "CollectorRegistry",
    "Counter",
    "FastAPI",
    "Gauge",
    "Histogram",
    "JSONResponse",
    "Request",
    "RequestValidationError",
    "Response",
    "StarletteHTTPException",
    "StreamingResponse",
    "generate_latest",
    "uvicorn",
]
