"""The LLM engine: paged KV cache, prefix caching and continuous batching over an HF model.

``core/`` schedules (torch-free), ``worker/`` runs the model, ``cpu/`` prepares a model for
the CPU decode step; this package's top holds the public engine (``llm_engine``), the driver
it holds (``driver``: scheduler, runner and step loop), model loading (``loader``), result
delivery (``streams``), a request's own faults (``request_faults``), the process-wide engines
(``shared_engines``) and what is read from the model's config files (``hf_config``).

The names below load on first use, so importing a submodule (``engine.core``...) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_ascend.engine.core.outputs import EngineStats, RequestOutput, TokenDelta
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.engine.shared_engines import get_engine

__all__ = ["EngineStats", "LLMEngine", "RequestOutput", "SamplingParams", "TokenDelta",
           "get_engine"]

_HOMES = {
    "EngineStats": "langchain_ascend.engine.core.outputs",
    "LLMEngine": "langchain_ascend.engine.llm_engine",
    "RequestOutput": "langchain_ascend.engine.core.outputs",
    "SamplingParams": "langchain_ascend.engine.core.sampling_params",
    "TokenDelta": "langchain_ascend.engine.core.outputs",
    "get_engine": "langchain_ascend.engine.shared_engines",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
