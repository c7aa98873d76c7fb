"""Run an app on 127.0.0.1 in a background thread: for tests, benchmarks and notebooks that
need a real server in the same process (``langchain-ascend serve`` is the command for the
rest)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from langchain_ascend.serve.web import uvicorn


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(app: Any, *, port: int | None = None, start_timeout_s: float = 60.0,
            graceful_timeout_s: int = 5) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a daemon thread until the block ends.

    Yields:
        The base URL, ``http://127.0.0.1:PORT`` (a free port unless ``port`` is given).

    Raises:
        RuntimeError: The server did not start within ``start_timeout_s``.
    """
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning",
                                           timeout_graceful_shutdown=graceful_timeout_s))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=graceful_timeout_s + 30)
