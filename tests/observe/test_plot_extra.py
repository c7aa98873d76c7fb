"""Without matplotlib (the ``plot`` extra) the chart raises an ImportError naming the extra,
and the demo's --out writes the trace and summary with a one-line note instead of the PNG."""

from __future__ import annotations

import sys

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_ascend import AscendTimeline
from langchain_ascend.errors import LangChainAscendError, MissingExtraError

HINT = "pip install 'langchain-ascend[plot]'"


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError


@pytest.fixture
def timeline():
    with AscendTimeline() as recorded:
        FakeListChatModel(responses=["ok"]).invoke("hi")
    return recorded


def test_the_chart_names_the_extra(no_matplotlib, timeline, tmp_path):
    with pytest.raises(ImportError, match=HINT.replace("[", r"\[").replace("]", r"\]")) as exc:
        timeline.write_png(tmp_path / "t.png")
    assert isinstance(exc.value, MissingExtraError) and isinstance(exc.value, LangChainAscendError)
    assert not (tmp_path / "t.png").exists()


def test_the_demo_skips_the_png_with_a_note(no_matplotlib, timeline, tmp_path, capsys):
    from langchain_ascend.app.demo import write_outputs

    files = write_outputs(timeline, tmp_path, title="t")
    assert [f.name for f in files] == ["trace.json", "summary.txt"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("note: no timeline.png") and HINT in out[0]


def test_with_matplotlib_the_chart_is_written(timeline, tmp_path):
    pytest.importorskip("matplotlib")
    path = timeline.write_png(tmp_path / "t.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
