"""Every notebook under notebooks/ runs top to bottom on the CPU, offline, on the real default
model (SmolLM2-135M-Instruct; ``LANGCHAIN_ASCEND_MODEL`` picks another), and is stored as
``notebooks/make_notebooks.py`` writes it: without outputs."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from langchain_ascend.testing import needs_smollm2

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
EXPECTED = ["01_chat_tools_streaming.ipynb", "02_rag_lcel.ipynb", "03_agent_timeline.ipynb"]
#: Each notebook stays well inside this on the 2-core CPU (about 20-40 s measured).
NOTEBOOK_LIMIT_S = 150.0

needs_model = (pytest.mark.skipif(False, reason="") if os.environ.get("LANGCHAIN_ASCEND_MODEL")
               else needs_smollm2())


@needs_model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    printing = [c for c in nb.cells if c.cell_type == "code" and "print(" in c.source]
    assert printing and all(c.get("outputs") for c in printing)
    assert seconds < NOTEBOOK_LIMIT_S, f"{path.name} took {seconds:.0f} s"
    if path.name.startswith("03_"):  # the timeline chart is shown inline and files written
        images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if "image/png" in o.get("data", {})]
        assert images and (tmp_path / "agent_timeline.png").stat().st_size > 0
        assert (tmp_path / "agent_trace.json").stat().st_size > 0


def test_the_three_notebooks_are_there_without_outputs() -> None:
    assert [p.name for p in NOTEBOOKS] == EXPECTED
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), path.name
        assert any("LANGCHAIN_ASCEND_MODEL" in c.source for c in code), path.name


def test_the_notebooks_are_what_make_notebooks_writes(tmp_path: Path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("make_notebooks", FOLDER / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_notebooks", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "HERE", tmp_path)
    module.main()
    for name in EXPECTED:
        assert (tmp_path / name).read_text() == (FOLDER / name).read_text(), (
            f"{name} differs from notebooks/make_notebooks.py: edit the script, then run it")
