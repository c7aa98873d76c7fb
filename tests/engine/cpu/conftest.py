"""Fixtures shared by the CPU decoder tests."""

from __future__ import annotations

import pytest

from langchain_ascend.native import stack_kernel as native_stack


@pytest.fixture
def stack_calls(monkeypatch):
    """Every call of the native stack kernel wrapper, as its number of rows."""
    calls = []
    run = native_stack.run_stack

    def spy(layers, hidden, *args, **kwargs):
        calls.append(hidden.shape[0])
        return run(layers, hidden, *args, **kwargs)

    monkeypatch.setattr(native_stack, "run_stack", spy)
    return calls
