"""Pytest parameters for the accelerators, each skipped with the reason it is unusable here."""

from __future__ import annotations

from typing import Any


def accelerator_params() -> list[Any]:
    """``[cuda, npu]`` as ``pytest.param`` s with their ``cuda`` / ``npu`` markers, each skipped
    with :mod:`langchain_ascend.platform`'s reason where that device cannot be used."""
    import pytest

    from langchain_ascend import platform

    reasons = {"cuda": platform.cuda_reason(), "npu": platform.probe_npu().reason}
    return [pytest.param(kind, marks=[getattr(pytest.mark, kind), pytest.mark.skipif(
        bool(reason), reason=reason or f"{kind} available")])
        for kind, reason in reasons.items()]
