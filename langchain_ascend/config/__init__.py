"""Build an agent and its components from one ``agent_config.yaml`` (or dict).

The schema is the one the Ascend agent article used (``npu``, ``model``, ``tools``) plus our
own sections (``embeddings``, ``vectorstore``, ``agent``); ``docs/config.md`` is the reference
and ``examples/agent_config.yaml`` an annotated example::

    npu:
      device: auto                # auto | npu | cuda | cpu (ours)
      context: {device_id: 0}     # -> device "npu:0" (or cuda:0; ignored on CPU)
      stream: {enable_async: true}    # tool calls on their own device streams
    model:
      path: /models/Qwen2.5-7B-Instruct
      dtype: bfloat16
      kv_cache_policy: paged
      max_context_length: 8192
    tools: {timeout_ms: 5000, retry_times: 2, enable_parallel: true}
    vectorstore: {texts_file: docs.txt, k: 4}
    agent: {max_hops: 8}

Every section forbids unknown keys; a misspelt key gets the closest known one suggested; a
key that no API can honour (``npu.context.priority``, ``npu.memory.max_host_memory_mb``) or
a value the engine cannot honour (``model.kv_cache_policy`` other than ``paged``) is rejected
with the reason. Errors are :class:`ConfigError` naming the dotted key path, file and line.

Example:
    .. code-block:: python

        from langchain_ascend.config import load_agent_config

        parts = load_agent_config("agent_config.yaml", tools=[get_weather])
        parts.agent.invoke({"messages": [("user", "Weather in Paris?")]})

``load_config`` is the same without the agent: it builds only the sections the file has.
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
