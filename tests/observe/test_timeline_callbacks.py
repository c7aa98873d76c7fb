"""AscendTimeline driven through its callback methods with realistic payloads, the phase
placement of a hop, track packing, retrievers, streaming and a real tiny AscendChatModel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda

from langchain_ascend import AscendTimeline
from langchain_ascend.observe import HopSpan, ToolSpan
from langchain_ascend.observe.records import pack_tracks
from langchain_ascend.observe.timeline import fill_hop


def test_segments_placed_back_from_the_end() -> None:
    hop = HopSpan("r", "r", "m", start=1.0, end=2.0, queue_s=0.1, ttft_s=0.4, decode_s=0.3)
    segs = {s.kind: (round(s.start, 6), round(s.end, 6)) for s in hop.segments()}
    assert segs == {"other": (1.0, 1.3), "queue": (1.3, 1.4), "prefill": (1.4, 1.7),
                    "decode": (1.7, 2.0)}


def test_segments_clamped_inside_the_hop() -> None:
    hop = HopSpan("r", "r", "m", start=0.0, end=0.5, queue_s=0.2, ttft_s=5.0, decode_s=0.3)
    segs = hop.segments()
    assert segs[0].start == 0.0 and segs[-1].end == 0.5
    assert all(0.0 <= s.start <= s.end <= 0.5 for s in segs)


def test_segments_from_first_token_or_none() -> None:
    streamed = HopSpan("r", "r", "m", start=0.0, end=1.0, first_token=0.25)
    assert [(s.kind, s.start, s.end) for s in streamed.segments()] == [
        ("prefill", 0.0, 0.25), ("decode", 0.25, 1.0)]
    plain = HopSpan("r", "r", "m", start=0.0, end=1.0)
    assert [s.kind for s in plain.segments()] == ["other"]


def test_fill_hop_reads_usage_timings_and_speculation() -> None:
    message = AIMessage(
        "x", usage_metadata={"input_tokens": 50, "output_tokens": 9, "total_tokens": 59,
                             "input_token_details": {"cache_read": 32}},
        response_metadata={"timings": {"queue": 0.01, "time_to_first_token": 0.2,
                                       "decode": 0.1},
                           "speculative": {"draft_tokens": 6, "accepted_tokens": 4,
                                           "forced_tokens": 1, "forward_passes": 3}})
    hop = HopSpan("r", "r", "m", start=0.0)
    fill_hop(hop, message)
    assert (hop.input_tokens, hop.cached_tokens, hop.new_tokens, hop.output_tokens) == (
        50, 32, 18, 9)
    assert (hop.queue_s, hop.ttft_s, hop.decode_s) == (0.01, 0.2, 0.1)
    assert hop.tokens_per_pass == 3.0 and hop.speculative == {
        "draft_tokens": 6, "accepted_tokens": 4, "forced_tokens": 1, "forward_passes": 3}
    bare = HopSpan("r", "r", "m", start=0.0)
    fill_hop(bare, AIMessage("x"))
    assert (bare.input_tokens, bare.tokens_per_pass, bare.queue_s) == (0, 1.0, None)


def test_pack_tracks() -> None:
    spans = [ToolSpan(str(i), "r", "p", "t", None, start=s, end=e)
             for i, (s, e) in enumerate([(0, 2), (1, 3), (2, 4), (0.5, 0.7)])]
    tracks = pack_tracks("tool", spans)
    assert [[getattr(s, "key", None) for s in t.spans] for t in tracks] == [["0", "2"],
                                                                           ["3", "1"]]
    assert [t.label for t in tracks] == ["tool", "tool 2"]


def test_direct_callbacks_retry_error_and_loose_calls() -> None:
    timeline = AscendTimeline()
    chain, hop_id, attempt1, attempt2 = uuid4(), uuid4(), uuid4(), uuid4()
    timeline.on_chat_model_start({"name": "AscendChatModel"}, [[HumanMessage("hi")]],
                                 run_id=hop_id, metadata={"ls_model_name": "org/model-x"})
    timeline.on_llm_end(LLMResult(generations=[[ChatGeneration(message=AIMessage(
        "", usage_metadata={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}))]]),
        run_id=hop_id)
    timeline.on_chain_start(None, {}, run_id=chain, name="tools")
    timeline.on_tool_start({"name": "search"}, "{}", run_id=attempt1, parent_run_id=chain,
                           tool_call_id="c1", name="search")
    timeline.on_tool_error(ConnectionError("reset"), run_id=attempt1)
    timeline.on_tool_start({"name": "search"}, "{}", run_id=attempt2, parent_run_id=chain,
                           tool_call_id="c1", name="search")
    timeline.on_tool_error(ValueError("bad query"), run_id=attempt2)
    timeline.on_chain_end([], run_id=chain)
    [hop] = timeline.hops
    assert hop.model == "model-x" and hop.input_tokens == 10
    [tool] = timeline.tool_calls
    assert (tool.status, tool.attempts, tool.retries) == ("error", 2, 1)
    assert tool.error == "ValueError: bad query"
    # A model called on its own and an executor invoked on its own share the "calls" run.
    [run] = timeline.snapshot().runs()
    assert run.name == "calls" and len(run.hops) == 1 and len(run.tools) == 1


def test_llm_error_and_late_tool_end_ignored() -> None:
    timeline = AscendTimeline()
    hop_id, chain, attempt = uuid4(), uuid4(), uuid4()
    timeline.on_chat_model_start({}, [[]], run_id=hop_id)
    timeline.on_llm_error(RuntimeError("engine died"), run_id=hop_id)
    timeline.on_chain_start(None, {}, run_id=chain, name="tools")
    timeline.on_tool_start({}, "{}", run_id=attempt, parent_run_id=chain, tool_call_id="c",
                           name="slow")
    timeline.on_chain_end([], run_id=chain)  # the executor gave up on it
    timeline.on_tool_end("late", run_id=attempt)
    assert timeline.hops[0].error == "RuntimeError: engine died"
    assert timeline.tool_calls[0].status == "timeout"
    assert "error: RuntimeError: engine died" in timeline.summary()


class _Docs(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        return [Document(page_content=f"{query} {i}") for i in range(3)]


def test_retriever_and_streamed_hop(tmp_path: Path) -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    retriever = _Docs()
    model = GenericFakeChatModel(messages=iter([AIMessage("hello there friend")]))

    def rag(question: str, config: Any) -> str:
        docs = retriever.invoke(question, config)
        return "".join(str(c.content) for c in model.stream(f"{docs}", config))

    timeline = AscendTimeline()
    RunnableLambda(rag, name="rag").invoke("what", config={"callbacks": [timeline]})
    [retrieval] = timeline.retrievals
    assert retrieval.num_documents == 3 and retrieval.query == "what"
    [hop] = timeline.hops
    assert hop.first_token is not None and hop.first_token <= (hop.end or 0)
    trace = json.loads(timeline.write_chrome_trace(tmp_path / "t.json").read_text())
    assert [e["name"] for e in trace["traceEvents"] if e.get("cat") == "retrieval"] == ["_Docs"]
    assert "_Docs" in timeline.summary()
    assert timeline.write_png(tmp_path / "t.png").stat().st_size > 0


@pytest.fixture(scope="module")
def tiny_model(tiny_qwen2_path: Path) -> Any:
    from langchain_ascend.chat_models import AscendChatModel

    return AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0,
                           max_tokens=8)


def test_real_tiny_model_metadata_parsed(tiny_model: Any, tmp_path: Path) -> None:
    timeline = AscendTimeline()
    prompt = [HumanMessage("tell me about the prefix cache " * 12)]
    tiny_model.invoke(prompt, config={"callbacks": [timeline]})
    "".join(str(c.content) for c in tiny_model.stream(prompt, config={"callbacks": [timeline]}))
    first, second = timeline.hops
    for hop in (first, second):
        assert hop.input_tokens > 0 and hop.output_tokens > 0
        assert hop.queue_s is not None and hop.ttft_s is not None and hop.decode_s is not None
        assert hop.ttft_s > 0 and hop.tokens_per_pass >= 1.0
        kinds = [s.kind for s in hop.segments()]
        assert "prefill" in kinds and "decode" in kinds
    assert second.cached_tokens > 0  # the same prompt again: served from the prefix cache
    trace = json.loads(timeline.write_chrome_trace(tmp_path / "t.json").read_text())
    hop_events = [e for e in trace["traceEvents"] if e.get("cat") == "hop"]
    assert len(hop_events) == 2 and hop_events[1]["args"]["cached_tokens"] == second.cached_tokens
    assert timeline.summary().count("\n  1 ") + timeline.summary().count("\n  2 ") == 2
