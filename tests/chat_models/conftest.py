"""Fixtures for AscendChatModel tests on the tiny random-weight qwen2 model (CPU)."""

from __future__ import annotations

import pytest
from chat_test_tools import get_time, get_weather

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import build_model


@pytest.fixture(scope="session")
def tiny_chat(tiny_qwen2_path) -> AscendChatModel:
    """Greedy chat model with short replies; its engine loads once for the whole session."""
    model = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=0,
                            max_tokens=16)
    model.warm_up()
    return model


@pytest.fixture
def weather_tools():
    return [get_weather, get_time]


@pytest.fixture(scope="session")
def tiny_no_tools_path():
    """The tiny qwen2 model whose tokenizer's ChatML template ignores tools (like SmolLM2's)."""
    return build_model("tiny", "qwen2", chat_template="no_tools")


@pytest.fixture(scope="session")
def tiny_no_tools_chat(tiny_no_tools_path) -> AscendChatModel:
    """Greedy chat model on the tool-less template; tools go through the fallback format."""
    return AscendChatModel(budget_closed_output="complete", model=str(tiny_no_tools_path), device="cpu", temperature=0,
                           max_tokens=16)
