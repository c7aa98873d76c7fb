"""How many of a ``batch`` call's inputs run at once. Pure (no torch).

LangChain's default ``Runnable.batch`` runs inputs on a thread pool of
``min(32, cores + 4)`` workers (6 on a 2-core machine), so the engine never sees more than six
of sixteen conversations and cannot batch them together. The chat model's ``batch`` lets every
input reach the engine at once instead (the engine queues what does not fit its batch);
a ``max_concurrency`` the caller set is honoured as given.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list

MAX_BATCH_THREADS = 256
"""Most caller threads one ``batch`` call starts (each waits on its request in the engine)."""


def batch_configs(config: RunnableConfig | Sequence[RunnableConfig] | None,
                  num_inputs: int) -> list[RunnableConfig]:
    """One config per input; where the caller set no ``max_concurrency``, all inputs run at
    once (at most :data:`MAX_BATCH_THREADS`)."""
    configs = get_config_list(config, num_inputs)
    if any(c.get("max_concurrency") is not None for c in configs):
        return configs
    limit = max(1, min(num_inputs, MAX_BATCH_THREADS))
    return [{**c, "max_concurrency": limit} for c in configs]
