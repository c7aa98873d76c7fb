"""One cache root (langchain_ascend.cache_dir): its precedence, and every cache under it."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from langchain_ascend import cache_dir
from langchain_ascend.cache_dir import CACHE_ENV_VAR, cache_root, cache_subdir

PACKAGE = Path(cache_dir.__file__).parent


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in (CACHE_ENV_VAR, "XDG_CACHE_HOME", "LANGCHAIN_ASCEND_COMPILE_CACHE",
                 "LANGCHAIN_ASCEND_NATIVE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_root_is_the_variable_then_xdg_then_home(clean_env, monkeypatch):
    tmp = clean_env
    assert cache_root() == (tmp / "home/.cache/langchain_ascend").resolve()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "xdg"))
    assert cache_root() == (tmp / "xdg/langchain_ascend").resolve()
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp / "root"))
    assert cache_root() == (tmp / "root").resolve()
    assert not (tmp / "root").exists()  # the root is named, not created


def test_a_relative_xdg_cache_home_is_ignored(clean_env, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache_root() == (clean_env / "home/.cache/langchain_ascend").resolve()


def test_a_cache_with_its_own_variable_takes_that_folder(clean_env, monkeypatch):
    monkeypatch.setenv(CACHE_ENV_VAR, str(clean_env / "root"))
    assert cache_subdir("native") == (clean_env / "root/native").resolve()
    monkeypatch.setenv("LANGCHAIN_ASCEND_NATIVE_CACHE", str(clean_env / "mine"))
    assert cache_subdir("native", override_env="LANGCHAIN_ASCEND_NATIVE_CACHE") == (
        clean_env / "mine").resolve()


def test_every_cache_lives_under_the_one_root(clean_env, monkeypatch):
    from langchain_ascend.engine.model_source import gguf_cache_dir
    from langchain_ascend.engine.worker.measured import cache_dir as measured_cache_dir
    from langchain_ascend.native.build import cache_dir as native_cache_dir
    from langchain_ascend.testing import resolve_cache_dir

    root = (clean_env / "root").resolve()
    monkeypatch.setenv(CACHE_ENV_VAR, str(root))
    assert resolve_cache_dir() == root / "models"
    assert gguf_cache_dir() == root / "gguf"
    assert measured_cache_dir() == root / "measured"
    assert native_cache_dir() == root / "native"


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings aside: they may name the default)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_module_hard_codes_the_cache_folder_or_reads_the_root_variable():
    offenders = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name != "cache_dir.py"
                 and any(".cache/langchain_ascend" in text or text in {CACHE_ENV_VAR, ".cache"}
                         for text in _code_strings(path))]
    assert offenders == []


def test_the_cache_lock_excludes_other_holders(tmp_path):
    from langchain_ascend.engine.model_source.support import file_lock

    inside: list[int] = []
    overlaps: list[int] = []

    def hold(number: int) -> None:
        with file_lock(tmp_path / "x.lock"):
            if inside:
                overlaps.append(number)
            inside.append(number)
            time.sleep(0.05)
            inside.remove(number)

    threads = [threading.Thread(target=hold, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert overlaps == [] and inside == []
    assert (tmp_path / "x.lock").exists()
