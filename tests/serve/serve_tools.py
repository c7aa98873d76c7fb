"""Tools the server tests name by import path (``serve_tools:get_weather``) in an agent config."""

from __future__ import annotations

from langchain_core.tools import tool

NOT_A_TOOL = 42


@tool
def get_weather(city: str) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city}"


def get_time(timezone: str) -> str:
    """Current time in a timezone."""
    return f"12:00 in {timezone}"
