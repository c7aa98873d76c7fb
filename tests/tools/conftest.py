"""Fixtures of the NPUStreamToolExecutor tests."""

from __future__ import annotations

from tool_test_helpers import release

__all__ = ["release"]
