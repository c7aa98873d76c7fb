"""Tool-call formats, one object per model family's syntax, found by name. Pure (no torch).

Each :class:`~langchain_ascend.tool_formats.format_base.ToolFormat` holds its markers, its parser and
its forcing grammar (and, for Hermes, the fallback's prompt rendering). ``chat/`` splits replies
and renders prompts with them; ``structured/`` builds grammars with them. ``"auto"`` means all
of them when parsing and Hermes when a call is forced.
"""

from __future__ import annotations

from typing import Literal

from langchain_ascend.tool_formats.format_base import RawCall, ToolFormat
from langchain_ascend.tool_formats.hermes import HERMES, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from langchain_ascend.tool_formats.llama3 import LLAMA3_JSON, PYTHON_TAG
from langchain_ascend.tool_formats.mistral import MISTRAL, MISTRAL_MARKER

ToolCallFormat = Literal["auto", "hermes", "llama3_json", "mistral"]
TOOL_CALL_FORMATS: tuple[str, ...] = ("auto", "hermes", "llama3_json", "mistral")

FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}

TOOL_CALL_MARKERS: dict[str, tuple[str, ...]] = {name: f.markers for name, f in FORMATS.items()}
"""Each format's marker texts, the call opener first (read from the format objects)."""


def formats_for(fmt: str) -> tuple[ToolFormat, ...]:
    """The formats ``fmt`` recognises: that one, or all of them for ``"auto"``."""
    return (FORMATS[fmt],) if fmt in FORMATS else tuple(FORMATS.values())


def forcing_format(fmt: str) -> ToolFormat:
    """The syntax a forced call is written in: ``auto`` (no hint) forces Hermes ``<tool_call>``."""
    return FORMATS.get(fmt, HERMES)


def markers_of(fmt: str) -> tuple[str, ...]:
    """The marker texts of ``fmt`` (``"auto"``: of every format)."""
    return tuple(m for f in formats_for(fmt) for m in f.markers)


def call_openers(fmt: str) -> list[str]:
    """The texts that open a call in ``fmt`` (``"auto"``: in any format)."""
    return [f.opener for f in formats_for(fmt)]


def detect_tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """Guess the tool-call format a chat template teaches its model.

    Args:
        chat_template: The tokenizer's Jinja chat template source (``None`` when absent).

    Returns:
        ``"hermes"``, ``"mistral"``, ``"llama3_json"``, or ``"auto"`` when the template gives
        no recognisable hint.
    """
    if not chat_template:
        return "auto"
    if TOOL_CALL_OPEN in chat_template:
        return "hermes"
    if MISTRAL_MARKER in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template or '"parameters"' in chat_template:
        return "llama3_json"
    return "auto"


__all__ = [
    "FORMATS",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_FORMATS",
    "TOOL_CALL_MARKERS",
    "TOOL_CALL_OPEN",
    "RawCall",
    "ToolCallFormat",
    "ToolFormat",
    "call_openers",
    "detect_tool_call_format",
    "forcing_format",
    "formats_for",
    "markers_of",
]
