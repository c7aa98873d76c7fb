"""The demo: its tools, its agent run and report on the tiny random-weight model, its command
line. The real-model run is in ``integration_tests/test_demo_smollm2.py``."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from guard_closed import guard_closed_calls_taken
from langchain_core.messages import AIMessage

from langchain_ascend.app import cli, demo


@pytest.fixture(scope="module")
def tiny_run(tiny_qwen2_path, tmp_path_factory):
    """One demo run on the tiny model with ``--out``: its printout, its rows, the out folder."""
    out = tmp_path_factory.mktemp("demo_out")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), guard_closed_calls_taken():
        rows = demo.run_demo(str(tiny_qwen2_path), device="cpu", max_hops=2, max_tokens=40,
                             questions=("Calculate 7 * 24.", "Get the weather in Beijing."),
                             out=out, progress=False)
    return buffer.getvalue(), rows, out


def test_the_report_has_every_section(tiny_run):
    text, rows, _ = tiny_run
    assert text.count("user: ") == 2 and text.count("assistant: ") == 2
    assert "setup: " in text and "tools: get_weather, calculator, search_docs" in text
    # every setup stage, with its wall and CPU time, in the order it ran
    stages = re.search(r"  stages: (.*)", text).group(1)
    names = re.findall(r"(?:^|; )([^;]+?) \d+\.\d s \(CPU \d+\.\d s\)", stages)
    # on a clean checkout the load stage also names the C kernels compiling meanwhile
    names = [re.sub(r" \(compiling [\w, ]+\.c: first run\)$", "", name) for name in names]
    assert names == ["source: config, tokenizer", "load: weights, kernels, KV cache",
                     "warm-up step", "indexing", "tool grammars",
                     "agent prompt -> prefix cache"]
    # hop 1 forced to call, hop 2 (the last of max_hops=2) forced to answer
    assert text.count("hop 1 [tool_choice=required]") == 2
    assert text.count("hop 2 [tool_choice=none]") == 2
    assert "from prefix cache" in text and "finish_reason=" in text and "executor: " in text
    assert re.search(r"      (get_weather|calculator|search_docs) \[(success|error)\]", text)
    assert "prompt tokens served from the prefix cache" in text
    # the timeline's summary table and the files written
    assert "run question 1: 2 hops" in text and "wrote " in text
    assert [(r.question, r.hop) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]


def test_hop_rows_carry_cache_hits_and_tool_calls(tiny_run):
    _, rows, _ = tiny_run
    first, second = rows[0], rows[1]
    assert first.tool_calls and not second.tool_calls
    assert first.cache_read > 0  # the warm-up put the system prompt and tools in the cache
    assert second.cache_read >= first.cache_read
    assert second.input_tokens > first.input_tokens and all(r.seconds > 0 for r in rows)


def test_out_writes_the_trace_the_chart_and_the_summary(tiny_run):
    _, _, out = tiny_run
    for name in ("trace.json", "timeline.png", "summary.txt"):
        assert (out / name).stat().st_size > 0, name
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("ph") == "X" for e in events)
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hops" in (out / "summary.txt").read_text()


def test_a_cut_answer_says_finish_reason_length(capsys):
    reply = AIMessage("It is", response_metadata={"finish_reason": "length"},
                      usage_metadata={"input_tokens": 10, "output_tokens": 3, "total_tokens": 13,
                                      "input_token_details": {"cache_read": 8}})
    row = demo.hop_row(1, 2, 3, reply, 0.5)
    assert (row.tool_choice, row.cache_read, row.finish_reason) == ("auto", 8, "length")
    assert row.tokens_per_pass is None  # no speculative figures reported
    spec = {"draft_tokens": 4, "accepted_tokens": 2, "forced_tokens": 1, "forward_passes": 2}
    reply.response_metadata["speculative"] = spec
    row = demo.hop_row(1, 1, 3, reply, 0.5)
    assert row.tool_choice == "required" and row.tokens_per_pass == 1.5
    demo._print_hop(row, reply)
    assert "2/4 drafted accepted, 1 forced" in capsys.readouterr().out


def test_tools_are_deterministic_and_refuse_bad_input():
    weather, calculator = demo.build_tools()
    assert calculator.invoke({"expression": "7 * 24"}) == "168"
    assert calculator.invoke({"expression": "1 / 4"}) == "0.25"
    assert "4°C" in weather.invoke({"city": " beijing "})
    assert "4°C" in weather.invoke({"city": "Beijing, China"})
    assert "no weather data" in weather.invoke({"city": "Paris"})
    with pytest.raises(ValueError, match="unsupported expression"):
        demo.safe_eval("__import__('os')")
    with pytest.raises(ValueError, match="exponent too large"):
        demo.safe_eval("2 ** 1000")


def test_the_bundled_documents_load():
    docs = demo.load_documents()
    assert len(docs) >= 10 and all({"id", "text", "topic"} <= set(d) for d in docs)


def test_default_demo_model_is_the_real_smollm2_file():
    pytest.importorskip("gguf")
    from langchain_ascend.testing import needs_smollm2  # noqa: F401  (helper exists)

    path, random_weights = demo.resolve_demo_model(None)
    assert path.endswith(".gguf") and not random_weights
    assert demo.resolve_demo_model("/some/folder") == ("/some/folder", False)


def test_demo_help_lists_the_demo_options(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--model", "--device", "--dtype", "--max-tokens", "--max-hops", "--question",
                   "--out", "--no-progress"):
        assert option in out
    assert "tiny-random" in re.sub(r"-\s+", "-", out)  # argparse may wrap after the hyphen


def test_cli_rejects_an_unknown_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bogus"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
