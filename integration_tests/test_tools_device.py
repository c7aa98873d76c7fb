"""NPUStreamToolExecutor on a real accelerator: tools doing torch work run on side streams,
see what the caller queued before, and their results are safe to use on the caller's stream
without a global synchronize. Skipped (with the reason) where the device is missing; the CPU
no-op path and the stream protocol (with a fake device) are tested in tests/tools/.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from langchain_ascend import NPUStreamToolExecutor, platform

torch = pytest.importorskip("torch")


def _backend(kind: str) -> Any:
    return torch.npu if kind == "npu" else torch.cuda


def _executor(kind: str, num_calls: int) -> tuple[NPUStreamToolExecutor, dict[str, Any]]:
    """An executor whose tool multiplies a caller-prepared matrix many times on the device."""
    from langchain_core.tools import tool

    device = platform.resolve_device(kind)
    mod = _backend(kind)
    seen: dict[str, Any] = {"streams": {}, "default": mod.default_stream(device)}
    barrier = threading.Barrier(num_calls, timeout=30)

    @tool(response_format="content_and_artifact")
    def heavy(key: str, repeats: int) -> tuple[str, Any]:
        """Device work on the current stream; returns the result tensor as the artifact."""
        stream = mod.current_stream(device)
        seen["streams"][key] = stream
        barrier.wait()  # every call is in flight at once
        x = seen["inputs"][key]  # (N, N), written by the caller on its stream
        for _ in range(repeats):
            x = torch.tanh(x @ seen["rotation"])  # (N, N)
        return f"ran on {stream}", x

    return NPUStreamToolExecutor([heavy], device=kind, timeout_ms=60_000), seen


def _check(kind: str, use_async: bool) -> None:
    device = platform.resolve_device(kind)
    mod = _backend(kind)
    keys = [f"k{i}" for i in range(4)]
    executor, seen = _executor(kind, len(keys))
    generator = torch.Generator().manual_seed(0)
    host = {k: torch.randn(1024, 1024, generator=generator) for k in keys}
    # An orthogonal matrix: x -> tanh(x @ Q) is a contraction, so float32 rounding on the device
    # stays at rounding size over all repeats (x -> tanh(x @ x) amplified it to sign flips).
    rotation = torch.linalg.qr(torch.randn(1024, 1024, generator=generator,
                                           dtype=torch.float64))[0].to(torch.float32)
    seen["rotation"] = rotation.to(device)

    # The caller queues a long kernel, then writes the inputs on its own stream: the tools
    # must be ordered after both (the executor's "ready" event).
    warm = torch.randn(4096, 4096, device=device)
    for _ in range(8):
        warm = warm @ warm / 4096
    seen["inputs"] = {k: torch.empty(1024, 1024, device=device) for k in keys}
    for k in keys:
        seen["inputs"][k].copy_(host[k], non_blocking=True)

    calls = [{"name": "heavy", "args": {"key": k, "repeats": 20}, "id": k, "type": "tool_call"}
             for k in keys]
    out = asyncio.run(executor.ainvoke(calls)) if use_async else executor.invoke(calls)
    # No synchronize: read the artifacts on the caller's stream right away.
    results = [m.artifact.clone() for m in out]

    expected = {}
    for k in keys:
        x = host[k].to(torch.float64)
        for _ in range(20):
            x = torch.tanh(x @ rotation.to(torch.float64))
        expected[k] = x
    mod.synchronize(device)
    streams = seen["streams"]
    assert len({id(s) for s in streams.values()}) == len(keys)  # one stream per call
    assert all(s != seen["default"] for s in streams.values())  # none is the default stream
    assert [m.status for m in out] == ["success"] * len(keys)
    assert all(m.response_metadata["tool_timing"]["stream"] for m in out)
    for k, result in zip(keys, results, strict=True):
        torch.testing.assert_close(result.cpu().to(torch.float64), expected[k],
                                   rtol=1e-3, atol=1e-3)


cuda_reason = platform.cuda_reason()
npu_reason = platform.probe_npu().reason


@pytest.mark.cuda
@pytest.mark.skipif(bool(cuda_reason), reason=cuda_reason or "CUDA available")
@pytest.mark.parametrize("use_async", [False, True])
def test_cuda_tools_run_on_their_own_streams(use_async: bool) -> None:
    _check("cuda", use_async)


@pytest.mark.npu
@pytest.mark.skipif(bool(npu_reason), reason=npu_reason or "NPU available")
@pytest.mark.parametrize("use_async", [False, True])
def test_npu_tools_run_on_their_own_streams(use_async: bool) -> None:
    _check("npu", use_async)
