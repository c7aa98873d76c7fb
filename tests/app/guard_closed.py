"""The app tests' demo runs on the random model."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest

from langchain_ascend.app import demo
from langchain_ascend.config import components


@contextlib.contextmanager
def guard_closed_calls_taken() -> Iterator[None]:
    """The demo and config chat models take a call the budget guard closed as complete
    (``budget_closed_output="complete"``): the random model's strings end only there."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (demo, components):
            patch.setattr(module, "AscendChatModel", functools.partial(
                module.AscendChatModel, budget_closed_output="complete"))
        yield
