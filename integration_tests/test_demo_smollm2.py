"""The README's first command, ``langchain-ascend demo --out DIR``, on the real default model
(SmolLM2-135M-Instruct) as a user runs it: a fresh process, the model already converted.

Bars (issue 12, issue 16): under 2 minutes on the 2-core CPU, English answers, the tool calls,
per-hop cache hits and times printed, the trace, the chart and the summary written.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from langchain_ascend.testing import needs_smollm2

pytestmark = needs_smollm2()

WALL_LIMIT_S = 120.0


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[str, float, Path]:
    from langchain_ascend.testing import smollm2_path

    smollm2_path(progress=False)  # "after install": the GGUF conversion is not part of the run
    out = tmp_path_factory.mktemp("demo")
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "langchain_ascend.app.cli", "demo", "--out", str(out)],
        capture_output=True, text=True, timeout=2 * WALL_LIMIT_S, check=False)
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, wall, out


def test_the_demo_runs_in_under_two_minutes(demo_run):
    text, wall, _ = demo_run
    assert wall < WALL_LIMIT_S, f"demo took {wall:.1f} s\n{text}"


def test_it_prints_calls_cache_hits_and_times_per_hop(demo_run):
    text, _, _ = demo_run
    assert "SmolLM2-135M-Instruct" in text
    hops = re.findall(r"hop (\d) \[tool_choice=(\w+)\] ([\d.]+) s \| prompt (\d+) tok, (\d+) from "
                      r"prefix cache", text)
    assert len(hops) == 6  # three questions, two hops each (hop 1 calls, hop 2 answers)
    assert all(float(seconds) > 0 for _, _, seconds, _, _ in hops)
    assert all(choice == "required" for hop, choice, *_ in hops if hop == "1")
    # the warm-up cached the system prompt and tool schemas: every hop reads them back
    assert all(int(cached) > 0 for *_, cached in hops)
    assert re.search(r"      (get_weather|calculator|search_docs) \[success\]", text)


def test_the_answers_are_english(demo_run):
    text, _, _ = demo_run
    answers = re.findall(r"^assistant: (.*)$", text, flags=re.MULTILINE)
    assert len(answers) == 3
    for answer in answers:
        assert answer.strip() and answer != "(empty reply)"
        assert sum(ch.isascii() for ch in answer) / len(answer) > 0.9, answer
    # The model's known limit: it sometimes copies the <tool_response> block back (the random
    # tool-call id in that block changes from run to run, and with it the greedy reply); the
    # demo says so. The weather and calculator questions answer with the tool's result in most
    # runs (measured: 8 of 9 replies); at least one of them must here.
    echoes = [a.startswith("<tool_response>") for a in answers]
    assert text.count("copied the <tool_response> block") == sum(echoes)
    english = [a for a, echo in zip(answers[:2], echoes[:2], strict=True) if not echo]
    assert any(re.search(r"\b(168|4°C)", a) for a in english), answers
    assert 'calculator({"expression": "7 * 24"})' in text


def test_out_holds_the_trace_the_chart_and_the_summary(demo_run):
    text, _, out = demo_run
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert sum(e.get("cat") == "hop" for e in spans) == 6
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.txt").read_text()
    assert "total: " in summary and summary.strip() in text
