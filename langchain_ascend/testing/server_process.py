"""``langchain-ascend serve`` (or any OpenAI-compatible server command) in a subprocess on
127.0.0.1 and a free port, for the soak test and the server benchmark.

The server loads and warms its model before its port opens, so :func:`server_process` waits
until ``GET <health_path>`` answers 200 (or the process exits: its output is then in the
error). On the way out the process gets SIGTERM, then SIGKILL after ``stop_timeout``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

SERVE_CODE = "import sys; from langchain_ascend.app.cli import main; sys.exit(main())"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(model: str, port: int, *options: str) -> list[str]:
    """``langchain-ascend serve --model MODEL --port PORT OPTIONS...`` with this Python."""
    return [sys.executable, "-c", SERVE_CODE, "serve", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--no-progress", *options]


@dataclass
class RunningServer:
    """A started server: its base URL (``http://127.0.0.1:PORT``) and process."""

    url: str
    process: subprocess.Popen
    log_path: str

    def log(self) -> str:
        """What the process printed so far (stdout and stderr together)."""
        with open(self.log_path, encoding="utf-8", errors="replace") as file:
            return file.read()


def get_status(url: str, timeout: float = 5.0) -> int:
    """The HTTP status of ``GET url`` (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return 0


def wait_healthy(server: RunningServer, health_path: str, timeout: float) -> None:
    """Poll ``health_path`` until it answers 200.

    Raises:
        RuntimeError: The process exited, or ``timeout`` seconds passed; with its output.
    """
    deadline = time.monotonic() + timeout
    while get_status(server.url + health_path, timeout=2.0) != 200:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.process.returncode} "
                               f"before it served:\n{server.log()[-4000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer {health_path} within {timeout:.0f} s:"
                               f"\n{server.log()[-4000:]}")
        time.sleep(0.25)


def stop(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def server_process(command: Sequence[str], port: int, *, env: Mapping[str, str] | None = None,
                   health_path: str = "/health", startup_timeout: float = 600.0,
                   stop_timeout: float = 30.0) -> Iterator[RunningServer]:
    """Run ``command`` (a server listening on ``port``) until the block ends.

    Args:
        command: The server's argv (:func:`serve_command` for ours).
        port: The port it listens on, on 127.0.0.1.
        env: Variables added to this process's environment.
        health_path: The route that answers 200 once the server serves.
        startup_timeout: Seconds it gets to load its model and answer.
        stop_timeout: Seconds it gets to exit after SIGTERM.

    Yields:
        The running server.
    """
    log = tempfile.NamedTemporaryFile("wb", prefix="server-", suffix=".log", delete=False)
    process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **dict(env or {})})
    server = RunningServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log.name)
    try:
        wait_healthy(server, health_path, startup_timeout)
        yield server
    finally:
        stop(process, stop_timeout)
        log.close()
        os.unlink(log.name)
