"""Tools shared by the chat-model tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from langchain_core.tools import tool


@tool
def get_weather(city: str, days: int) -> str:
    """Weather forecast for a city over a number of days."""
    return f"sunny in {city} for {days} days"


@tool
def get_time(timezone: str) -> str:
    """Current time in a timezone."""
    return f"12:00 in {timezone}"
