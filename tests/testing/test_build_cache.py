"""Cache folder choice, fingerprints, race-safe atomic builds, the CLI and the MiniLM locator."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from langchain_ascend.testing import minilm_path, resolve_cache_dir
from langchain_ascend.testing.__main__ import main
from langchain_ascend.testing.cache import (
    CACHE_ENV_VAR,
    TOKENIZER_SOURCES,
    build_once,
    builder_fingerprint,
)


def test_cache_dir_argument_beats_environment_beats_default(tmp_path, monkeypatch) -> None:
    # $LANGCHAIN_ASCEND_CACHE is the package's cache ROOT: the test models go to its models/.
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "from_env"))
    assert resolve_cache_dir(tmp_path / "explicit") == (tmp_path / "explicit").resolve()
    assert resolve_cache_dir() == (tmp_path / "from_env" / "models").resolve()
    assert (tmp_path / "from_env" / "models").is_dir()
    monkeypatch.delenv(CACHE_ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir() == (tmp_path / "xdg" / "langchain_ascend/models").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_cache_dir() == (tmp_path / "home" / ".cache/langchain_ascend/models").resolve()


def test_fingerprint_depends_on_parameters_only_deterministically() -> None:
    first = builder_fingerprint(TOKENIZER_SOURCES, "model", "tiny", 0)
    assert first == builder_fingerprint(TOKENIZER_SOURCES, "model", "tiny", 0)
    assert first != builder_fingerprint(TOKENIZER_SOURCES, "model", "tiny", 1)
    assert first != builder_fingerprint(TOKENIZER_SOURCES[:-1], "model", "tiny", 0)
    assert len(first) == 12


def test_build_once_builds_then_reuses(tmp_path) -> None:
    calls: list[Path] = []

    def build(out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "weights.bin").write_bytes(b"abc")

    final = tmp_path / "artefact"
    assert build_once(final, build) == final
    assert build_once(final, build) == final
    assert len(calls) == 1
    assert calls[0] != final and not calls[0].exists()
    assert (final / "weights.bin").read_bytes() == b"abc"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "artefact"
    ]


def test_concurrent_builders_build_once_and_agree(tmp_path) -> None:
    calls: list[int] = []
    results: list[Path] = []

    def build(out_dir: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (out_dir / "done").write_text("ok")

    def worker() -> None:
        results.append(build_once(tmp_path / "shared", build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert results == [tmp_path / "shared"] * 4
    assert (tmp_path / "shared" / "done").read_text() == "ok"


def test_losing_a_rename_race_keeps_the_winner(tmp_path) -> None:
    final = tmp_path / "raced"

    def build(out_dir: Path) -> None:
        (out_dir / "mine").write_text("loser")
        final.mkdir()  # another process finished first
        (final / "theirs").write_text("winner")

    assert build_once(final, build) == final
    assert sorted(p.name for p in final.iterdir()) == ["theirs"]
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["raced"]


def test_failed_build_leaves_nothing_behind(tmp_path) -> None:
    def build(out_dir: Path) -> None:
        (out_dir / "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_once(tmp_path / "broken", build)
    assert [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_cli_build_prints_the_model_folder(tiny_qwen2_path, capsys) -> None:
    cache = str(tiny_qwen2_path.parent)
    assert main(["build", "--preset", "tiny", "--arch", "qwen2", "--cache-dir", cache]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_qwen2_path)


def test_cli_rejects_unknown_preset(capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["build", "--preset", "huge"])
    assert raised.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_python_dash_m_prints_minilm_folder() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "langchain_ascend.testing", "minilm"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert Path(completed.stdout.strip()) == minilm_path()


def test_minilm_path_loads_offline_as_sentence_transformer(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path = minilm_path()
    assert (path / "config.json").is_file()
    model = SentenceTransformer(str(path), device="cpu")
    vectors = model.encode(["The weather in Paris is sunny.", "It rains in London."])
    assert vectors.shape == (2, 384)
