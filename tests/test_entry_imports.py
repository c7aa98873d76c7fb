"""The public entry points load no heavy dependency they do not need (issue 26): each import,
in a fresh interpreter, leaves in ``sys.modules`` at most the heavy modules measured when
the package's imports moved to the top of its modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "torch_npu", "transformers", "xgrammar", "fastapi", "uvicorn", "ray",
         "matplotlib", "numpy", "faiss", "sentence_transformers", "gguf", "llama_cpp",
         "langchain_core")

ENTRIES = {
    "langchain_ascend": set(),
    "langchain_ascend.chat_models": {"numpy", "langchain_core"},
    "langchain_ascend.embeddings": {"langchain_core"},
    "langchain_ascend.vectorstores": {"numpy", "langchain_core"},
    "langchain_ascend.tools": {"langchain_core"},
    "langchain_ascend.app.cli": set(),  # the console script: --version, --help, info
}


def heavy_after_import(module: str) -> set[str]:
    code = (f"import json, sys; import {module}; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", sorted(ENTRIES))
def test_entry_import_loads_no_more_heavy_modules(module):
    extra = heavy_after_import(module) - ENTRIES[module]
    assert not extra, f"import {module} now loads {sorted(extra)}"


def test_the_probe_sees_a_heavy_import():
    assert "numpy" in heavy_after_import("langchain_ascend.quant.gguf_file")
