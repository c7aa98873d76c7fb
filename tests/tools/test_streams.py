"""Device streams of NPUStreamToolExecutor.

On this CPU machine the stream layer must be a no-op. The accelerator path is checked with a
fake device whose streams and events log what the executor asks of them (the real CUDA / NPU
runs are in integration_tests/test_tools_device.py): every concurrent call gets its own side
stream, ordered after the caller's earlier work, and the caller's stream waits for each call
before the executor returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from langchain_core.tools import tool
from tool_test_helpers import Gate, tool_call

from langchain_ascend import NPUStreamToolExecutor, platform
from langchain_ascend.errors import DeviceUnavailableError
from langchain_ascend.executor import workers as _tool_workers


def test_cpu_is_a_no_op_path() -> None:
    seen: list[Any] = []

    @tool
    def matmul(n: int) -> float:
        """Torch work on the CPU."""
        seen.append(platform.current_stream(torch.device("cpu")))
        x = torch.ones(n, n)
        return float((x @ x).sum())

    for device in ("cpu", "auto", None):
        executor = NPUStreamToolExecutor([matmul], device=device)
        out = executor.invoke([tool_call("matmul", "a", n=4), tool_call("matmul", "b", n=2)])
        assert [m.content for m in out] == ["64.0", "8.0"]
        assert all(m.response_metadata["tool_timing"]["stream"] is None for m in out)
        assert executor.device == "cpu"
    assert seen == [None] * 6


def test_explicit_accelerator_without_one_is_a_clear_error() -> None:
    if not platform.cuda_reason():
        pytest.skip("a CUDA device is present")
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        NPUStreamToolExecutor([], device="cuda")


class FakeDevice:
    type = "npu"

    def __str__(self) -> str:
        return "npu:0"


class FakeEvent:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.stream: FakeStream | None = None

    def record(self, stream: FakeStream) -> None:
        self.stream = stream
        self.log.append(("record", stream.name, id(self)))


class FakeStream:
    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.log = log
        self.device = FakeDevice()

    def wait_event(self, event: FakeEvent) -> None:
        assert event.stream is not None, "waited on an event that was never recorded"
        self.log.append(("wait", self.name, id(event), event.stream.name))

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


class FakeBackend:
    """Stands in for torch.npu: thread-local current stream, logged events."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.default = FakeStream("default", self.log)
        self.local = threading.local()
        self.created = 0

    def new_stream(self, device: Any) -> FakeStream:
        with self.lock:
            self.created += 1
            return FakeStream(f"side{self.created}", self.log)

    def current_stream(self, device: Any) -> FakeStream:
        return getattr(self.local, "stream", self.default)

    def new_event(self, device: Any) -> FakeEvent:
        return FakeEvent(self.log)

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[None]:
        previous = self.current_stream(None)
        self.local.stream = stream
        try:
            yield
        finally:
            self.local.stream = previous


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    backend = FakeBackend()
    monkeypatch.setattr(platform, "resolve_device", lambda device="auto": FakeDevice())
    for name in ("new_stream", "current_stream", "new_event", "use_stream"):
        monkeypatch.setattr(platform, name, getattr(backend, name))
    monkeypatch.setattr(_tool_workers, "_stream_pools", {})
    return backend


def test_each_concurrent_call_gets_its_own_stream_and_the_caller_waits(fake: FakeBackend) -> None:
    gate = Gate(target=3)
    streams: dict[str, str] = {}

    @tool
    def device_work(i: int) -> int:
        """Records the stream it runs on."""
        streams[f"c{i}"] = platform.current_stream(None).name
        fake.log.append(("tool", streams[f"c{i}"]))
        gate.pass_through()
        return i

    executor = NPUStreamToolExecutor([device_work], device="npu")
    out = executor.invoke([tool_call("device_work", f"c{i}", i=i) for i in range(3)])
    assert executor.device == "npu:0"
    assert len(set(streams.values())) == 3 and "default" not in streams.values()
    assert [m.response_metadata["tool_timing"]["stream"] for m in out] == [
        f"<FakeStream {streams[f'c{i}']}>" for i in range(3)]

    log = fake.log
    ready = log[0]
    assert ready[:2] == ("record", "default")  # recorded on the caller's stream first
    for side in streams.values():
        wait_ready = log.index(("wait", side, ready[2], "default"))
        ran = log.index(("tool", side))
        done = next(i for i, e in enumerate(log) if e[:2] == ("record", side))
        caller_waits = log.index(("wait", "default", log[done][2], side))
        assert wait_ready < ran < done < caller_waits


def test_streams_are_reused_across_invocations(fake: FakeBackend) -> None:
    @tool
    def work(i: int) -> int:
        """No-op."""
        return i

    executor = NPUStreamToolExecutor([work], device="npu", max_concurrency=2)
    for _ in range(3):
        executor.invoke([tool_call("work", f"c{i}", i=i) for i in range(4)])
    assert fake.created <= 2


async def test_async_mode_streams_for_sync_tools_only(fake: FakeBackend) -> None:
    @tool
    def sync_work(i: int) -> str:
        """Reports its stream."""
        return platform.current_stream(None).name

    @tool
    async def async_work(i: int) -> str:
        """Reports its stream."""
        return platform.current_stream(None).name

    executor = NPUStreamToolExecutor([sync_work, async_work], device="npu")
    out = await executor.ainvoke([tool_call("sync_work", "s", i=1),
                                  tool_call("async_work", "a", i=2)])
    assert out[0].content.startswith("side") and out[1].content == "default"
    assert out[1].response_metadata["tool_timing"]["stream"] is None


def test_failed_calls_release_their_stream(fake: FakeBackend) -> None:
    @tool
    def fail(i: int) -> str:
        """Fails on the device."""
        raise RuntimeError("device error")

    executor = NPUStreamToolExecutor([fail], device="npu", max_concurrency=1)
    out = executor.invoke([tool_call("fail", f"c{i}", i=i) for i in range(3)])
    assert all(m.status == "error" and "device error" in m.content for m in out)
    assert fake.created == 1


def test_device_tensors_finds_nested_tensors() -> None:
    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)

    class Message:
        artifact = {"x": [a, (b,)], "y": "text"}

    found = _tool_workers.device_tensors([Message(), {"z": c}], torch.device("cpu"))
    assert {id(t) for t in found} == {id(a), id(b), id(c)}
    assert _tool_workers.device_tensors(a, torch.device("meta")) == []
