"""Agent sessions through AscendChatModel: the agent sets them, hops park and resume, tool
results are prefilled as they land, and greedy text does not change (tiny random model)."""

from __future__ import annotations

import time

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from langchain_ascend.agent import create_ascend_agent
from langchain_ascend.chat.session_prefill import LandingPrefill
from langchain_ascend.observe import AscendTimeline


@tool
def lookup(key: str) -> str:
    """Look a key up in the slow catalogue."""
    time.sleep(0.2 + 0.05 * (len(key) % 3))
    return f"catalogue entry for {key}: " + " ".join(f"item{i}" for i in range(20))


SYSTEM = "You are a catalogue agent. " + "Use the lookup tool for every question. " * 10


def make_agent(llm):
    return create_ascend_agent(llm, [lookup], max_hops=3, system_prompt=SYSTEM,
                               first_hop_tool_choice="required", final_hop_tool_choice="none")


def run_agent(llm, question: str, callbacks=None):
    config = {"callbacks": callbacks} if callbacks else None
    return make_agent(llm).invoke(question, config)["messages"]


def contents(messages):
    return [(type(m).__name__, m.content, [c["args"] for c in getattr(m, "tool_calls", [])])
            for m in messages]


def test_agent_parks_resumes_and_prefills_without_changing_text(tiny_chat):
    llm = tiny_chat.model_copy(update={"max_tokens": 40})
    engine = llm.get_engine()
    before = engine.stats()
    timeline = AscendTimeline()
    with_landing = run_agent(llm, "What is in aisle 7?", [timeline])
    after = engine.stats()
    fed = [p for hop in timeline.hops for p in hop.tool_time_prefills]
    assert fed and all(tokens >= 0 for _, _, tokens in fed)
    # A prefill began while a tool still ran (whether the tiny model's few-ms prefill also
    # ends after a tool's start is a race with the executor's start callback, not checked).
    assert any(start < tool.end for start, _, _ in fed for tool in timeline.tool_calls)
    names = {e["name"] for e in timeline.to_chrome_trace()["traceEvents"]}
    assert "tool-time prefill" in names
    assert after.num_sessions_parked > before.num_sessions_parked
    assert after.num_resumed > before.num_resumed
    assert after.num_resume_hits > before.num_resume_hits
    assert after.num_background_tokens > before.num_background_tokens  # prefilled in tool time
    assert after.tool_latency_s.get("lookup", 0) > 0.04   # measured by the executor
    assert after.num_retained_sessions == 0               # the final answer released it
    one_shot = run_agent(llm.model_copy(update={"prefill_tool_results": False}),
                         "What is in aisle 7?")
    assert contents(with_landing) == contents(one_shot)
    # The last hop, asked again of its model without a session: the same text.
    final_prompt = [SystemMessage(SYSTEM), *with_landing[:-1]]
    last_hop = sum(isinstance(m, AIMessage) for m in with_landing)
    plain = make_agent(llm).models[last_hop - 1].invoke(final_prompt)
    assert plain.content == with_landing[-1].content


def test_session_id_on_bind_and_per_call(tiny_chat):
    tiny_chat = tiny_chat.model_copy(update={"max_tokens": 48})
    engine = tiny_chat.get_engine()
    parked = engine.stats().num_sessions_parked
    bound = tiny_chat.bind_tools([lookup], tool_choice="required").bind(session_id="s-bind")
    reply = bound.invoke([HumanMessage("aisle 3?")])
    assert reply.tool_calls
    assert engine.stats().num_sessions_parked == parked + 1
    answer = tiny_chat.invoke([HumanMessage("aisle 3?")], session_id="s-bind")
    assert isinstance(answer, AIMessage)                  # no calls: the session is released
    assert engine.stats().num_retained_sessions == 0
    plain = tiny_chat.invoke([HumanMessage("aisle 3?")])  # no session: as before
    assert plain.content == answer.content


class FakeEngine:
    def __init__(self) -> None:
        self.prefills: list[list[int]] = []
        self.latencies: list[tuple[str, float]] = []
        self.fallbacks = 0

    def prefill_session(self, session_id, ids):
        self.prefills.append(list(ids))
        return True

    def record_tool_latency(self, name, seconds):
        self.latencies.append((name, seconds))

    def note_template_fallback(self):
        self.fallbacks += 1


def render_chars(messages) -> list[int]:
    """A prefix-stable 'template': every message as '<role>content|', chars as ids."""
    text = "".join(f"<{m.type}>{m.content}|" for m in messages)
    return [ord(c) for c in text]


def test_landing_prefill_keeps_call_order_and_stops_before_the_last():
    reply = AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": f"c{i}"}
                                      for i in range(3)])
    conversation = [HumanMessage("q")]
    hop_prompt = render_chars(conversation)
    engine = FakeEngine()
    landing = LandingPrefill(engine, "s", render_chars, conversation, reply, hop_prompt)
    landing.start()          # the wrapper of the first tool message, before any result
    expected_wrapper = render_chars([*conversation, reply]) + [ord(c) for c in "<tool>"]
    assert engine.prefills == [expected_wrapper]
    result = {i: ToolMessage(f"r{i}", tool_call_id=f"c{i}") for i in range(3)}
    landing.tool_finished("c1", "lookup", result[1], 0.2)   # early: waits for c0
    assert len(engine.prefills) == 1
    landing.tool_finished("c0", "lookup", result[0], 0.3)   # c0 and c1 in call order
    assert engine.prefills[-1] == render_chars(
        [*conversation, reply, result[0], result[1]]) + [ord(c) for c in "<tool>"]
    landing.tool_finished("c2", "lookup", result[2], 0.4)   # the last: left to the next call
    assert len(engine.prefills) == 2
    assert [name for name, _ in engine.latencies] == ["lookup"] * 3
    assert engine.fallbacks == 0


def test_landing_prefill_falls_back_on_a_template_that_rewrites_history():
    reply = AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "c0"},
                                      {"name": "lookup", "args": {}, "id": "c1"}])
    conversation = [HumanMessage("q")]
    engine = FakeEngine()

    def rewriting(messages):  # drops earlier human turns once a tool result follows
        kept = [m for m in messages if not (m.type == "human" and len(messages) > 2)]
        return render_chars(kept)

    landing = LandingPrefill(engine, "s", rewriting, conversation, reply,
                             render_chars(conversation))
    landing.start()
    assert engine.prefills == [] and engine.fallbacks == 1
    landing.tool_finished("c0", "lookup", ToolMessage("r", tool_call_id="c0"), 0.1)
    assert engine.prefills == [] and engine.fallbacks == 1
