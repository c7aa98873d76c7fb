"""Fixtures for AscendChatModel tests on the tiny random-weight qwen2 model (CPU)."""

from __future__ import annotations

import pytest
from chat_test_tools import get_time, get_weather

from langchain_ascend.chat_models import AscendChatModel


@pytest.fixture(scope="session")
def tiny_chat(tiny_qwen2_path) -> AscendChatModel:
    """Greedy chat model with short replies; its engine loads once for the whole session."""
    model = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0,
                            max_tokens=16)
    model.warm_up()
    return model


@pytest.fixture
def weather_tools():
    return [get_weather, get_time]
