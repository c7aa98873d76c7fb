"""The demo agent's control flow and command line, on the tiny random-weight model."""

from __future__ import annotations

import re

import pytest

from langchain_ascend.app import cli, demo
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.tools import NPUStreamToolExecutor


class _Retriever:
    def invoke(self, query: str) -> list:
        from langchain_core.documents import Document

        return [Document(page_content=f"notes about {query}", id="doc-1")]


@pytest.fixture(scope="module")
def demo_parts(tiny_qwen2_path):
    tools = demo.build_tools(_Retriever())
    llm = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0, max_tokens=24)
    return llm, NPUStreamToolExecutor(tools, timeout_ms=5000), tools


def test_agent_run_forces_the_first_call_and_always_ends_with_an_answer(demo_parts, capsys):
    llm, executor, tools = demo_parts
    rows, reply = demo.run_agent(llm, executor, tools, "What is 7 * 24?", max_hops=3,
                                 force_all=True)
    # Random weights with every hop but the last forced: two tool hops, then tool_choice="none".
    assert len(rows) == 3
    assert rows[0]["tool_calls"] and rows[1]["tool_calls"]
    assert rows[2]["tool_calls"] == [] and not reply.tool_calls
    assert {name for row in rows[:2] for name in row["tool_calls"]} <= {t.name for t in tools}
    # Later hops reuse the earlier hops' prompt from the prefix cache.
    assert rows[1]["cache_read"] > 0 and rows[2]["cache_read"] >= rows[1]["cache_read"]
    out = capsys.readouterr().out
    assert "hop 1:" in out and "executor:" in out and "from prefix cache" in out


def test_tools_are_deterministic_and_refuse_bad_input():
    search, weather, calculator = demo.build_tools(_Retriever())
    assert calculator.invoke({"expression": "7 * 24"}) == "168"
    assert "4°C" in weather.invoke({"city": " beijing "})
    assert "no weather data" in weather.invoke({"city": "Paris"})
    assert "[doc-1]" in search.invoke({"query": "kv"})
    with pytest.raises(ValueError, match="unsupported expression"):
        demo.safe_eval("__import__('os')")
    with pytest.raises(ValueError, match="exponent too large"):
        demo.safe_eval("2 ** 1000")


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
    for option in ("--model", "--device", "--dtype", "--max-tokens", "--max-hops", "--question"):
        assert option in out
    assert "tiny-random" in re.sub(r"-\s+", "-", out)  # argparse may wrap after the hyphen


def test_cli_rejects_an_unknown_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bogus"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
