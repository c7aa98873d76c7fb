"""The console script: --version, one-line errors with exit status 2, demo --config."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from guard_closed import guard_closed_calls_taken

from langchain_ascend._version import __version__
from langchain_ascend.app import cli, demo, demo_config
from langchain_ascend.app.demo import run_demo
from langchain_ascend.config import ConfigError, read_config
from langchain_ascend.errors import LangChainAscendError, ModelSourceError

EXAMPLES = Path(__file__).parents[2] / "examples"
SCRIPT = Path(sys.executable).with_name("langchain-ascend")


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"langchain-ascend {__version__}"


def test_the_installed_script_prints_the_version():
    if not SCRIPT.exists():
        pytest.skip("the langchain-ascend script is not installed in this environment")
    done = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, f"langchain-ascend {__version__}")


def test_the_version_has_one_source():
    import langchain_ascend
    from langchain_ascend.engine.worker import measured

    assert langchain_ascend.__version__ == __version__
    text = (Path(measured.__file__)).read_text(encoding="utf-8")
    assert "from langchain_ascend._version import __version__" in text
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = {attr = "langchain_ascend._version.__version__"}' in pyproject


def test_a_package_error_is_one_line_on_stderr_and_exit_2(capsys):
    def fail(argv):
        raise ModelSourceError("model not found: /nonexistent\nexpected a folder")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "_info", fail)
        assert cli.main(["info"]) == 2
    err = capsys.readouterr().err
    assert err == "langchain-ascend: error: model not found: /nonexistent expected a folder\n"


def test_other_exceptions_keep_their_traceback(monkeypatch):
    monkeypatch.setattr(cli, "_info", lambda argv: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["info"])


def test_demo_with_a_missing_model_exits_2_with_one_line():
    """The issue's case, in a process of its own: no traceback, nothing else on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "langchain_ascend.app.cli", "demo", "--model", "/nonexistent"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("langchain-ascend: error: ") and "/nonexistent" in lines[0]


def test_demo_with_a_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "agent_config.yaml"
    bad.write_text("agent:\n  max_hopz: 3\n", encoding="utf-8")
    assert cli.main(["demo", "--config", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "agent.max_hopz" in err[0] and "max_hops" in err[0]
    assert issubclass(ConfigError, LangChainAscendError)


@pytest.mark.parametrize(("option", "named"), [
    (["--device", "gpu"], "device='gpu'"), (["--dtype", "float64"], "dtype='float64'"),
    (["--max-tokens", "0"], "--max-tokens"), (["--max-hops", "-1"], "--max-hops"),
    (["--out", "/proc/no/such"], "--out /proc/no/such"),
])
def test_demo_checks_its_options_before_loading_anything(option, named, capsys, monkeypatch):
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("the demo ran"))
    assert cli.main(["demo", "--no-progress", *option]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("langchain-ascend: error: ") and named in err[0]


def test_config_data_fills_the_demo_defaults_and_the_command_line_wins(monkeypatch):
    monkeypatch.delenv("LANGCHAIN_ASCEND_MODEL", raising=False)
    monkeypatch.delenv("LANGCHAIN_ASCEND_CHAT_MODEL", raising=False)
    config = read_config(EXAMPLES / "agent_config.yaml")
    data = demo_config.config_data(config, demo_config.Overrides(), system_prompt="S",
                                   default_model=lambda: "/default.gguf")
    assert data["model"]["path"] == "/default.gguf"
    assert data["model"]["max_tokens"] == 256  # the file's own value is kept
    assert data["agent"]["max_hops"] == 4 and data["agent"]["system_prompt"] != "S"
    assert data["agent"]["first_hop_tool_choice"] == "required"
    assert Path(data["vectorstore"]["texts_file"]).is_absolute()

    monkeypatch.setenv("LANGCHAIN_ASCEND_MODEL", "/from/env")
    overrides = demo_config.Overrides(model="/cli", device="npu:1", dtype="float32",
                                      max_hops=3, max_tokens=8)
    data = demo_config.config_data(config, overrides, system_prompt="S",
                                   default_model=lambda: "/default.gguf")
    assert data["model"]["path"] == "/cli" and data["model"]["max_tokens"] == 8
    assert data["model"]["dtype"] == "float32" and data["agent"]["max_hops"] == 3
    assert data["npu"]["device"] == "npu" and data["npu"]["context"]["device_id"] == 1
    data = demo_config.config_data(config, demo_config.Overrides(), system_prompt="S",
                                   default_model=lambda: "/default.gguf")
    assert data["model"]["path"] == "/from/env"


def test_demo_config_builds_the_agent_from_the_example_file(tiny_qwen2_path):
    """examples/agent_config.yaml on the tiny model: its store and executor, the demo's tools."""
    overrides = demo_config.Overrides(model=str(tiny_qwen2_path), device="cpu", max_hops=2,
                                      max_tokens=40)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), guard_closed_calls_taken():
        rows = run_demo(questions=("Calculate 7 * 24.",), progress=False,
                        config=EXAMPLES / "agent_config.yaml", overrides=overrides)
    text = buffer.getvalue()
    assert f"config: {EXAMPLES / 'agent_config.yaml'}" in text
    assert "tools: get_weather, calculator, search_docs" in text
    assert [(r.question, r.hop, r.tool_choice) for r in rows] == [(1, 1, "required"),
                                                                   (1, 2, "none")]
    assert rows[0].tool_calls and rows[0].cache_read > 0  # warmed: system prompt + tools


def test_option_value_reads_both_spellings_and_the_last_wins():
    assert cli.option_value(["--model", "m", "--device", "cpu"], "--device") == "cpu"
    assert cli.option_value(["--device=npu:1"], "--device") == "npu:1"
    assert cli.option_value(["--device", "cpu", "--device=cuda"], "--device") == "cuda"
    assert cli.option_value(["--device"], "--device") is None
    assert cli.option_value(["--devices", "cpu"], "--device") is None


def test_demo_and_serve_start_the_kernel_compiles_only_where_the_cpu_is_likely(monkeypatch):
    from langchain_ascend import platform
    from langchain_ascend.native import build

    started = []
    monkeypatch.setattr(build, "start_compiles", lambda names: started.append(list(names)))
    monkeypatch.setattr(platform, "probably_cpu", lambda device: device in (None, "cpu"))
    cli._start_kernel_compiles(["--device", "cpu"])
    cli._start_kernel_compiles(["--device", "npu"])
    cli._start_kernel_compiles(["--help"])
    cli._start_kernel_compiles([])
    assert started == [["decode_stack"], ["decode_stack"]]
