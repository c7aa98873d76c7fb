"""Pytest parameters and marks for hardware-dependent tests, each skipped with the reason it
cannot run here."""

from __future__ import annotations

from typing import Any

from langchain_ascend import platform
from langchain_ascend.native import build


def accelerator_params() -> list[Any]:
    """``[cuda, npu]`` as ``pytest.param`` s with their ``cuda`` / ``npu`` markers, each skipped
    with :mod:`langchain_ascend.platform`'s reason where that device cannot be used."""
    import pytest

    reasons = {"cuda": platform.cuda_reason(), "npu": platform.probe_npu().reason}
    return [pytest.param(kind, marks=[getattr(pytest.mark, kind), pytest.mark.skipif(
        bool(reason), reason=reason or f"{kind} available")])
        for kind, reason in reasons.items()]


def needs_native_kernels() -> Any:
    """A ``skipif`` mark for tests of ``langchain_ascend.native``: skipped with
    :func:`langchain_ascend.native.build.host_problem`'s reason where the kernels cannot run
    (a host that should build them and fails still runs, and fails, the tests)."""
    import pytest

    problem = build.host_problem()
    return pytest.mark.skipif(problem is not None,
                              reason=f"native kernels cannot run here: {problem}")
