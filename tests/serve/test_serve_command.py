"""``langchain-ascend serve`` as a real process: the key from the environment, and SIGTERM
draining the request in flight before a clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from serve_helpers import free_port, sse_events, wait_until

from langchain_ascend.serve.serve_command import build_parser


def test_help_lists_every_option():
    text = build_parser().format_help()
    for option in ("--model", "--host", "--port", "--device", "--dtype", "--quantization",
                   "--served-model-name", "--api-key", "--config", "--max-waiting"):
        assert option in text
    assert build_parser().parse_args([]).host == "127.0.0.1"


@pytest.mark.parametrize("option, said", [
    (["--device", "tpu"], "device='tpu' is not a device"),
    (["--dtype", "float8"], "dtype='float8' is not supported"),
    (["--max-waiting", "-3"], "--max-waiting"),
    (["--max-context-length", "0"], "--max-context-length"),
    (["--port", "{busy}"], "it is in use"),
])
def test_options_that_cannot_work_fail_before_the_model_loads(tmp_path, capsys, option, said):
    """One line, exit 2, and no load: the model path does not even exist."""
    import socket

    from langchain_ascend.app.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        option = [o.replace("{busy}", str(busy.getsockname()[1])) for o in option]
        status = main(["serve", "--model", str(tmp_path / "not-loaded.gguf"), *option])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith("langchain-ascend: error:") and said in err
    assert len(err.splitlines()) == 1 and "not-loaded" not in err


def test_config_takes_the_command_lines_model_options(tmp_path):
    """``serve --model X --config FILE``: X is the config's model (one chat model for the
    agent and the chat route; the example file names none and failed), options given win."""
    from pathlib import Path

    from langchain_ascend.config import read_config
    from langchain_ascend.serve.serve_command import config_with_options

    example = Path(__file__).parents[2] / "examples" / "agent_config.yaml"
    args = build_parser().parse_args(["--config", str(example), "--model", "m.gguf",
                                      "--max-tokens", "7", "--device", "cpu"])
    data = config_with_options(args)
    assert data["model"]["path"] == "m.gguf" and data["model"]["max_tokens"] == 7
    assert data["model"]["max_context_length"] == 4096  # the file's, not given here
    assert data["model"]["dtype"] == "auto" and data["npu"]["device"] == "cpu"
    plain = config_with_options(build_parser().parse_args(["--config", str(example)]))
    assert "path" not in plain["model"] and plain["npu"]["device"] == "auto"
    assert plain["npu"]["context"]["device_id"] == 0  # the file's
    spelled = config_with_options(build_parser().parse_args(
        ["--config", str(example), "--dtype", "bf16", "--device", "NPU:1"]))
    assert spelled["model"]["dtype"] == "bfloat16" and spelled["npu"]["device"] == "npu"
    assert spelled["npu"]["context"]["device_id"] == 1
    no_index = config_with_options(build_parser().parse_args(
        ["--config", str(example), "--device", "cpu"]))
    assert "device_id" not in no_index["npu"]["context"]  # the CPU has no index
    read_config(no_index)  # and the config takes them all
    read_config(spelled)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_outside_0_65535_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--port", port])
    assert exit_info.value.code == 2 and "--port" in capsys.readouterr().err


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def server_process(tiny_qwen2_path):
    port = free_port()
    env = {**os.environ, "LANGCHAIN_ASCEND_API_KEY": "k3y"}
    process = subprocess.Popen(
        [sys.executable, "-m", "langchain_ascend.app.cli", "serve", "--model",
         str(tiny_qwen2_path), "--device", "cpu", "--port", str(port), "--no-embeddings",
         "--no-progress", "--served-model-name", "tiny", "--log-level", "warning",
         "--graceful-timeout", "60", "--max-context-length", "1024"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until(lambda: healthy(url) or process.poll() is not None, timeout=240) \
                or process.poll() is not None:
            output = process.communicate(timeout=10)[0] if process.poll() is not None else ""
            pytest.fail(f"the server did not come up: {output[-2000:]}")
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_sigterm_drains_the_stream_in_flight_and_exits_0(server_process):
    process, url = server_process
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    headers = {"Authorization": "Bearer k3y"}
    models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    started = threading.Event()
    payloads: list[str] = []

    def stream() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "A long story"}],
                "max_tokens": 200, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers,
                          timeout=120) as response:
            for line in response.iter_lines():
                payloads.append(line)
                started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    process.send_signal(signal.SIGTERM)
    reader.join(timeout=120)
    assert process.wait(timeout=120) == 0
    events = sse_events(payloads)
    assert events[-1] == "[DONE]"
    finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
                if json.loads(e)["choices"]]
    assert [f for f in finishes if f] and finishes[-1] in ("stop", "length")
    assert not healthy(url)
