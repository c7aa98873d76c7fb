"""AscendTimeline on a scripted two-hop agent with four parallel tool calls (ok, retried,
failing, timed out): the trace, the PNG, the summary, batch and async runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from timeline_fakes import HopScriptedModel, reply  # type: ignore[import-not-found]

from langchain_ascend import AscendTimeline
from langchain_ascend.errors import DeviceUnavailableError
from langchain_ascend.observe.npu_profile import profiler_problem

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _x_events(trace: dict[str, Any], cat: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == cat]


@pytest.fixture
def one_run(agent: Any) -> AscendTimeline:
    timeline = AscendTimeline()
    agent.invoke({"question": "q1"}, config={"callbacks": [timeline]})
    return timeline


def test_hops_and_tool_calls_recorded(one_run: AscendTimeline) -> None:
    hops = one_run.hops
    assert [(h.input_tokens, h.cached_tokens, h.output_tokens) for h in hops] == [
        (120, 0, 30), (200, 112, 12)]
    assert hops[0].tokens_per_pass == 1.0 and hops[0].speculative is None
    assert hops[1].tokens_per_pass == pytest.approx(12 / 4)
    assert hops[0].num_tool_calls == 4
    assert {seg.kind for seg in hops[1].segments()} >= {"queue", "prefill", "decode"}
    tools = {t.name: t for t in one_run.tool_calls}
    assert set(tools) == {"slow", "flaky", "broken", "hang"}
    assert (tools["slow"].status, tools["slow"].retries) == ("ok", 0)
    assert (tools["flaky"].status, tools["flaky"].retries, tools["flaky"].attempts) == ("ok", 1, 2)
    assert tools["broken"].status == "error" and "broken tool" in (tools["broken"].error or "")
    assert tools["hang"].status == "timeout"
    assert 0.1 < tools["hang"].duration < 0.5  # the 200 ms deadline, not the 600 ms sleep
    for tool in tools.values():  # every call between the two hops
        assert hops[0].end is not None and tool.start >= hops[0].end
        assert tool.end is not None and tool.end <= hops[1].start


def test_chrome_trace(one_run: AscendTimeline, tmp_path: Path) -> None:
    path = one_run.write_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    for event in events:
        assert {"ph", "pid", "tid", "name"} <= set(event)
        if event["ph"] == "X":
            assert isinstance(event["ts"], int) and isinstance(event["dur"], int)
            assert event["dur"] >= 0 and "args" in event
    hops, tools = _x_events(trace, "hop"), _x_events(trace, "tool")
    assert [e["name"] for e in hops] == ["hop 1: HopScriptedModel", "hop 2: HopScriptedModel"]
    assert hops[1]["args"]["cached_tokens"] == 112 and hops[1]["args"]["new_tokens"] == 88
    assert sorted(e["name"] for e in tools) == ["broken", "flaky", "hang", "slow"]
    assert {e["name"]: e["args"]["status"] for e in tools}["hang"] == "timeout"
    # Overlapping tool calls are on different threads (rows), none on the model's.
    by_name = {e["name"]: e for e in tools}
    slow, flaky = by_name["slow"], by_name["flaky"]
    assert slow["ts"] < flaky["ts"] + flaky["dur"] and flaky["ts"] < slow["ts"] + slow["dur"]
    assert slow["tid"] != flaky["tid"]
    assert hops[0]["tid"] not in {e["tid"] for e in tools}
    # Phases nest inside their hop.
    for phase in _x_events(trace, "phase"):
        hop = hops[phase["args"]["hop"] - 1]
        assert hop["ts"] <= phase["ts"] and phase["ts"] + phase["dur"] <= hop["ts"] + hop["dur"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"model", "tool", "tool 2"} <= names
    assert one_run.to_chrome_trace()["traceEvents"][0]["ph"] == "M"


def test_png(one_run: AscendTimeline, tmp_path: Path) -> None:
    path = one_run.write_png(tmp_path / "sub" / "timeline.png", title="scripted agent")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_png_of_nothing(tmp_path: Path) -> None:
    data = AscendTimeline().write_png(tmp_path / "empty.png").read_bytes()
    assert data.startswith(PNG_MAGIC)


def test_summary(one_run: AscendTimeline) -> None:
    text = one_run.summary()
    assert "run agent: 2 hops, 4 tool calls" in text
    lines = text.splitlines()
    hop_rows = [line for line in lines if "HopScriptedModel" in line]
    assert len(hop_rows) == 2
    assert hop_rows[0].split()[:1] == ["1"] and hop_rows[1].split()[:1] == ["2"]
    assert "112" in hop_rows[1] and "3.00" in hop_rows[1]
    for name, status in (("slow", "ok"), ("flaky", "ok"), ("broken", "error"),
                         ("hang", "timeout")):
        row = next(line for line in lines if line.strip().startswith(name))
        assert status in row
    assert "320 (112 cached, 35%)" in lines[-1]
    assert AscendTimeline().summary() == "(nothing recorded)"


def test_batch_of_three_keeps_runs_apart(agent: Any, tmp_path: Path) -> None:
    timeline = AscendTimeline()
    agent.batch([{"question": f"q{i}"} for i in range(3)], config={"callbacks": [timeline]})
    runs = timeline.snapshot().runs()
    assert [r.name for r in runs] == ["agent #1", "agent #2", "agent #3"]
    for run in runs:
        assert len(run.hops) == 2 and len(run.tools) == 4
        assert {t.name: t.retries for t in run.tools}["flaky"] == 1
        assert {t.name: t.status for t in run.tools}["hang"] == "timeout"
        assert len({h.root_id for h in run.hops} | {t.root_id for t in run.tools}) == 1
    trace = timeline.to_chrome_trace()
    assert len(_x_events(trace, "hop")) == 6 and len(_x_events(trace, "tool")) == 12
    assert {e["pid"] for e in _x_events(trace, "hop")} == {1, 2, 3}
    assert timeline.summary().count("run agent #") == 3


async def test_async_run(agent: Any) -> None:
    timeline = AscendTimeline()
    await agent.ainvoke({"question": "qa"}, config={"callbacks": [timeline]})
    assert len(timeline.hops) == 2
    assert {t.name: t.status for t in timeline.tool_calls} == {
        "slow": "ok", "flaky": "ok", "broken": "error", "hang": "timeout"}


def test_reset(one_run: AscendTimeline) -> None:
    one_run.reset()
    assert one_run.hops == [] and one_run.tool_calls == []


@pytest.mark.skipif(profiler_problem() is None, reason="an NPU is here: the profiler can start")
def test_profile_npu_without_npu_says_why() -> None:
    with pytest.raises(DeviceUnavailableError, match="needs an NPU"):
        with AscendTimeline(profile_npu=True):
            pass


@pytest.mark.npu
@pytest.mark.skipif(profiler_problem() is not None,
                    reason=f"torch_npu profiler unavailable: {profiler_problem()}")
def test_profile_npu_writes_profiler_output(agent: Any, tmp_path: Path) -> None:
    with AscendTimeline(profile_npu=True, profile_dir=tmp_path / "prof") as timeline:
        agent.invoke({"question": "npu"}, config={"callbacks": [timeline]})
    assert len(timeline.hops) == 2
    assert any((tmp_path / "prof").rglob("*")), "torch_npu.profiler wrote nothing"


class _RetrievingModel(HopScriptedModel):
    """Hop 1 asks for ``search_docs`` and ``slow`` at once; hop 2 answers."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> _RetrievingModel:  # type: ignore[override]
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        from langchain_core.messages import HumanMessage
        from langchain_core.outputs import ChatGeneration, ChatResult

        if isinstance(messages[-1], HumanMessage):
            calls = [{"name": "search_docs", "args": {"query": "npu"}, "id": "r1",
                      "type": "tool_call"},
                     {"name": "slow", "args": {"x": 1}, "id": "s1", "type": "tool_call"}]
            message = reply(calls, input_tokens=90, cached=0, output_tokens=20)
        else:
            message = reply([], input_tokens=150, cached=80, output_tokens=6)
        return ChatResult(generations=[ChatGeneration(message=message)])


def test_inside_create_ascend_agent_with_retrieval(agent_tools: list[Any],
                                                    tmp_path: Path) -> None:
    from langchain_core.documents import Document
    from langchain_core.messages import HumanMessage
    from langchain_core.retrievers import BaseRetriever

    from langchain_ascend import create_ascend_agent

    class Docs(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return [Document(page_content=f"{query} passage")]

    agent = create_ascend_agent(_RetrievingModel(), agent_tools[:1], retriever=Docs())
    timeline = AscendTimeline()
    agent.batch([{"messages": [HumanMessage(q)]} for q in ("a", "b")],
                config={"callbacks": [timeline]})
    runs = timeline.snapshot().runs()
    assert len(runs) == 2
    for run in runs:
        assert len(run.hops) == 2 and run.hops[1].cached_tokens == 80
        assert sorted(t.name for t in run.tools) == ["search_docs", "slow"]
        assert all(t.status == "ok" for t in run.tools)
        [retrieval] = run.retrievals  # the retriever ran inside the search_docs tool
        assert retrieval.num_documents == 1 and retrieval.query == "npu"
    trace = json.loads(timeline.write_chrome_trace(tmp_path / "t.json").read_text())
    assert len(_x_events(trace, "retrieval")) == 2 and len(_x_events(trace, "tool")) == 4
    assert "search_docs" in timeline.summary()
