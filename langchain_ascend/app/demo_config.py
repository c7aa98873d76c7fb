"""``langchain-ascend demo --config agent_config.yaml``: the demo agent built from a config file.

The file (``docs/config.md``, ``examples/agent_config.yaml``) describes the model, the device,
the tool executor, the store and the agent; the demo adds its two local tools (``get_weather``,
``calculator``) and, when the file has no ``vectorstore``, its ``search_docs`` over the bundled
documents. What the file leaves unset gets the demo's values (the SmolLM2 model, greedy, 64
tokens, hop 1 must call a tool, the last hop must answer, the demo's system prompt); options
given on the command line override the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_ascend.config import load_agent_config, read_config
from langchain_ascend.model_env import model_from_env

#: The file's ``model`` keys the demo fills when unset (greedy, short replies).
DEMO_MODEL_DEFAULTS = {"max_tokens": 64, "temperature": 0.0}


@dataclass(frozen=True)
class Overrides:
    """Command-line options that override the file (None: not given)."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_hops: int | None = None
    max_tokens: int | None = None


def _set_device(data: dict[str, Any], device: str) -> None:
    """``npu.device`` (+ ``npu.context.device_id`` for ``npu:N`` / ``cuda:N``) from a string."""
    kind, _, index = device.partition(":")
    npu = data.setdefault("npu", {})
    npu["device"] = kind
    context = npu.setdefault("context", {})
    if index:
        context["device_id"] = int(index) if index.isdigit() else index
    else:
        context.pop("device_id", None)


def config_data(config: Any, overrides: Overrides, *, system_prompt: str,
                default_model: Callable[[], str]) -> dict[str, Any]:
    """The validated config as a dict with the demo's defaults and the command line's
    overrides applied (``default_model()``: the model when neither the command line, the
    file nor ``$LANGCHAIN_ASCEND_MODEL`` names one)."""
    data = config.model_dump(exclude_unset=True, mode="json")
    model = data.setdefault("model", {})
    for key, value in DEMO_MODEL_DEFAULTS.items():
        model.setdefault(key, value)
    model["path"] = str(overrides.model or model.get("path") or model_from_env(required=False)
                        or default_model())
    if overrides.max_tokens is not None:
        model["max_tokens"] = overrides.max_tokens
    if overrides.dtype is not None:
        model["dtype"] = overrides.dtype
    if overrides.device is not None:
        _set_device(data, overrides.device)
    agent = data.setdefault("agent", {})
    agent.setdefault("system_prompt", system_prompt)
    agent.setdefault("first_hop_tool_choice", "required")
    agent.setdefault("final_hop_tool_choice", "none")
    if "max_hops" not in agent or overrides.max_hops is not None:
        agent["max_hops"] = 2 if overrides.max_hops is None else overrides.max_hops
    return data


def load_demo_config(path: str | os.PathLike[str], overrides: Overrides, *,
                     system_prompt: str, default_model: Callable[[], str],
                     extra_tools: list[Any], fallback_search: Any) -> Any:
    """Build the components of the config file at ``path`` (``AgentComponents``).

    Args:
        path: The YAML file; relative paths in it resolve against its folder.
        overrides: Command-line options that win over the file.
        system_prompt: The agent's system prompt when the file has none.
        default_model: Gives the model when nothing else names one.
        extra_tools: The demo's own tools, offered besides the file's retriever.
        fallback_search: Called with no argument for a ``search_docs`` tool when the file
            has no ``vectorstore``.

    Raises:
        ConfigError: The file is missing or invalid (names the key, file and line).
    """
    config = read_config(Path(path))
    data = config_data(config, overrides, system_prompt=system_prompt,
                       default_model=default_model)
    tools = list(extra_tools)
    if config.vectorstore is None:
        tools.append(fallback_search())
    return load_agent_config(data, tools=tools)
