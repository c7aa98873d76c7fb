"""langchain-ascend: LangChain components that make LLM agents fast on a local accelerator.

Ascend NPUs first (torch_npu / CANN), CUDA GPUs and plain CPU on the same code path.
Importing this package imports neither torch nor torch_npu; the classes load them on use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from langchain_ascend._version import __version__

_LAZY = {
    "AscendChatModel": "langchain_ascend.chat_models",
    "AscendEmbeddings": "langchain_ascend.embeddings",
    "AscendFAISS": "langchain_ascend.vectorstores",
    "NPUStreamToolExecutor": "langchain_ascend.tools",
    "create_ascend_agent": "langchain_ascend.agent",
    "load_agent_config": "langchain_ascend.config",
    "AscendTimeline": "langchain_ascend.observe",
}

__all__ = [
    "AscendChatModel",
    "AscendEmbeddings",
    "AscendFAISS",
    "AscendTimeline",
    "NPUStreamToolExecutor",
    "create_ascend_agent",
    "load_agent_config",
    "__version__",
]

if TYPE_CHECKING:
    from langchain_ascend.agent import create_ascend_agent
    from langchain_ascend.chat_models import AscendChatModel
    from langchain_ascend.config import load_agent_config
    from langchain_ascend.embeddings import AscendEmbeddings
    from langchain_ascend.observe import AscendTimeline
    from langchain_ascend.tools import NPUStreamToolExecutor
    from langchain_ascend.vectorstores import AscendFAISS


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'langchain_ascend' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
