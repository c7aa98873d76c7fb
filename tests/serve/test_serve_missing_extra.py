"""Without the ``serve`` / ``ray`` extras the server raises a MissingExtraError (an ImportError
naming the extra), and ``langchain-ascend serve`` prints it as one line and exits 2, as the CLI
does for every error the package checks."""

from __future__ import annotations

import sys

import pytest

from langchain_ascend.app.cli import main
from langchain_ascend.errors import LangChainAscendError, MissingExtraError

SERVE_HINT = "pip install 'langchain-ascend[serve]'"
RAY_HINT = "pip install 'langchain-ascend[ray]'"


def _hide(monkeypatch, *top_names: str, reimport: tuple[str, ...] = ()) -> None:
    """``import <top_name>`` fails (sys.modules entry None); ``reimport`` modules run again."""
    for name in [m for m in sys.modules
                 if m.split(".")[0] in top_names or m in reimport]:
        monkeypatch.delitem(sys.modules, name)
    for name in top_names:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def no_serve_extra(monkeypatch):
    # serve_command binds the extra's names at import: run it again too (test order).
    _hide(monkeypatch, "uvicorn", reimport=("langchain_ascend.serve.web",
                                            "langchain_ascend.serve.serve_command"))


@pytest.fixture
def no_ray_extra(monkeypatch):
    _hide(monkeypatch, "ray", reimport=("langchain_ascend.serve.ray.ray_app",))


def test_the_server_names_the_serve_extra(no_serve_extra):
    with pytest.raises(ImportError) as exc:
        import langchain_ascend.serve.web  # noqa: F401
    assert isinstance(exc.value, MissingExtraError) and isinstance(exc.value, LangChainAscendError)
    assert SERVE_HINT in str(exc.value) and "uvicorn" in str(exc.value)


def test_serve_without_the_extra_is_one_line_and_exit_2(no_serve_extra, capsys):
    assert main(["serve", "--model", "/nonexistent", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("langchain-ascend: error: ")
    assert SERVE_HINT in err[0]


def test_build_ray_app_names_the_ray_extra(no_ray_extra):
    from langchain_ascend.serve.ray import build_ray_app

    with pytest.raises(MissingExtraError, match=r"langchain-ascend\[ray\]"):
        build_ray_app()


def test_serve_ray_without_the_extra_is_one_line_and_exit_2(no_ray_extra, capsys):
    pytest.importorskip("fastapi")  # the serve parser itself needs the serve extra
    assert main(["serve", "--ray", "--model", "/nonexistent", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("langchain-ascend: error: --ray: ")
    assert RAY_HINT in err[0]
