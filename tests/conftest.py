"""Shared pytest fixtures: tiny offline models built once per cache (see langchain_ascend.testing).

Models are cached in ``models/`` of the package's cache root (``$LANGCHAIN_ASCEND_CACHE`` when
set, as ``.ci/run`` does: ``.cache/`` of the clone; else ``$XDG_CACHE_HOME/langchain_ascend`` or
``~/.cache/langchain_ascend``), so only the first session pays for the build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from langchain_ascend.testing import ARCHITECTURES, build_model


@pytest.fixture(scope="session")
def tiny_model_paths() -> dict[str, Path]:
    """Folder of the ``tiny`` model (with tokenizer) for each architecture: qwen2, llama, qwen3."""
    return {arch: build_model("tiny", arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def tiny_qwen2_path() -> Path:
    """Folder of the ``tiny`` qwen2 model with its tokenizer."""
    return build_model("tiny", "qwen2")
