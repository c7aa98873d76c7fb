"""Fixtures of the NPUStreamToolExecutor tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event hung tools wait on; set at teardown so no thread outlives the test for long."""
    event = threading.Event()
    yield event
    event.set()
