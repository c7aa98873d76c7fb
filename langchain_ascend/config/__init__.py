"""Build an agent and its components from one ``agent_config.yaml`` (or dict).

``load_agent_config(source, tools=...)`` validates the file (:class:`AgentConfig`, pydantic)
and builds what it describes; ``load_config`` is the same without the agent and
``read_config`` only validates. Every section forbids unknown keys (the closest known one is
suggested), and a key or value no API can honour is rejected with the reason instead of being
ignored, so a config never silently does less than it says. Every problem is one
:class:`ConfigError` naming each dotted key path, file and line. docs/config.md is the
reference, examples/agent_config.yaml an annotated example.
"""

from __future__ import annotations

from langchain_ascend.config.components import (
    AgentComponents,
    load_agent_config,
    load_config,
    read_config,
)
from langchain_ascend.config.schema import AgentConfig
from langchain_ascend.config.source import ConfigError, ConfigIssue

__all__ = [
    "AgentComponents",
    "AgentConfig",
    "ConfigError",
    "ConfigIssue",
    "load_agent_config",
    "load_config",
    "read_config",
]
