"""The fallback tool-calling format's prompt and history rendering, by its old names.

The format is Hermes' (:mod:`langchain_ascend.tool_formats.hermes`, where the markers, the
parser, the grammar and this rendering live together); this module keeps the import path.
"""

from __future__ import annotations

from langchain_ascend.tool_formats.hermes import (
    BODY_SUFFIX,
    CALL_SEPARATOR,
    CALL_SUFFIX,
    HERMES,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOLS_CLOSE,
    TOOLS_OPEN,
    body_prefix,
    call_prefix,
)

render_call = HERMES.render_call
render_calls = HERMES.render_calls
render_tool_response = HERMES.render_tool_response
render_tools_section = HERMES.render_tools_section

__all__ = [
    "BODY_SUFFIX",
    "CALL_SEPARATOR",
    "CALL_SUFFIX",
    "TOOLS_CLOSE",
    "TOOLS_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "body_prefix",
    "call_prefix",
    "render_call",
    "render_calls",
    "render_tool_response",
    "render_tools_section",
]
