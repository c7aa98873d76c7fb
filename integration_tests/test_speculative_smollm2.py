"""Speculative decoding and jump-forward on the real SmolLM2-135M-Instruct (greedy, CPU).

The bars of the speculation issue that do not depend on timing: a restated tool result is
token-identical with drafting on or off and most of it comes from accepted drafts; a forced
tool call is the same call with jump-forward on or off, in at most half a pass per token.
Speed is measured by ``benchmarks/bench_speculative.py``, not here. These run the float
(de-quantized) model: ``"auto"`` does not draft with quantized weights.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs

pytestmark = needs_smollm2()

TOOL_RESULT = (
    "Order 48213-B shipped on 14 March from the Shenzhen warehouse by SF Express, tracking "
    "number SF1402875531CN. Contents: two Atlas 300I Duo inference cards and one QSFP-DD "
    "cable. Estimated delivery is 17 March before 18:00; a signature is required."
)
COPY = [
    SystemMessage("You are a precise assistant. When asked to restate text, copy it exactly."),
    HumanMessage(f"The order tool returned:\n\n{TOOL_RESULT}\n\nRestate the tool result "
                 "exactly, word for word."),
]
TRACK_ORDER = {"type": "function", "function": {
    "name": "track_order", "description": "Look up an order by its id.",
    "parameters": {"type": "object", "properties": {
        "order_id": {"type": "string", "description": "The order id, e.g. 48213-B"}},
        "required": ["order_id"]}}}


@pytest.fixture(scope="module")
def chat() -> AscendChatModel:
    return AscendChatModel(**smollm2_chat_kwargs(max_tokens=96, quantization="none"))


def test_a_restated_tool_result_is_identical_and_mostly_drafted(chat):
    off = chat.invoke(COPY, speculative_decoding="off")
    on = chat.invoke(COPY, speculative_decoding="auto")
    assert on.content == off.content
    assert "SF1402875531CN" in on.content  # the model does copy it
    spec = on.response_metadata["speculative"]
    output = on.usage_metadata["output_tokens"]
    assert spec["accepted_tokens"] >= output / 2, spec
    assert spec["forward_passes"] <= output / 2, spec


def test_a_forced_tool_call_is_the_same_call_in_half_the_passes(chat):
    bound = chat.bind_tools([TRACK_ORDER], tool_choice="track_order")
    question = [HumanMessage("Where is my order 48213-B?")]
    off = bound.invoke(question, speculative_decoding="off")
    on = bound.invoke(question)
    assert [(c["name"], c["args"]) for c in on.tool_calls] == [
        (c["name"], c["args"]) for c in off.tool_calls]
    assert on.tool_calls[0]["name"] == "track_order"
    spec = on.response_metadata["speculative"]
    assert spec["forward_passes"] <= 0.5 * on.usage_metadata["output_tokens"], spec


ADD_STOPS = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip through several cities.",
    "parameters": {"type": "object", "properties": {
        "stops": {"type": "array", "description": "The stops, in order", "items": {
            "type": "object", "properties": {
                "city": {"type": "string"}, "nights": {"type": "integer"},
                "hotel": {"type": "string", "enum": ["budget", "standard", "luxury"]}},
            "required": ["city", "nights", "hotel"]}}},
        "required": ["stops"]}}}


def test_a_repetitive_forced_call_drafts_under_its_grammar_with_the_same_call(chat):
    # The items of an array repeat their keys and syntax: drafts from the reply itself are
    # verified row by row under the grammar and give the same call as one pass per token
    # (``num_speculative_tokens=0`` keeps the grammar's jump-forward, drafts nothing).
    bound = chat.bind_tools([ADD_STOPS], tool_choice="plan_trip")
    question = [HumanMessage("Plan a trip: Paris, Lima, Osaka, Cairo, Oslo and Quito, two "
                             "nights each in a standard hotel.")]
    # SmolLM2 repeats stops until the guard closes the array: take that call as complete
    plain = bound.invoke(question, num_speculative_tokens=0, max_tokens=160,
                         budget_closed_output="complete")
    drafted = bound.invoke(question, max_tokens=160, budget_closed_output="complete")
    assert drafted.tool_calls == plain.tool_calls
    stops = drafted.tool_calls[0]["args"]["stops"]
    assert len(stops) >= 3 and all(set(stop) == {"city", "nights", "hotel"} for stop in stops)
    spec, plain_spec = (m.response_metadata["speculative"] for m in (drafted, plain))
    assert plain_spec["draft_tokens"] == 0 and spec["accepted_tokens"] > 0, spec
    # every output token is a pass's own, forced by the grammar, or an accepted draft
    assert (spec["forward_passes"] + spec["forced_tokens"] + spec["accepted_tokens"]
            == drafted.usage_metadata["output_tokens"])
    assert spec["forward_passes"] < plain_spec["forward_passes"]


def test_a_second_hop_is_identical_on_and_off(chat):
    call = {"name": "track_order", "args": {"order_id": "48213-B"}, "id": "call_1"}
    history = [
        HumanMessage("Where is my order 48213-B?"),
        AIMessage("", tool_calls=[call]),
        ToolMessage(TOOL_RESULT, tool_call_id="call_1", name="track_order"),
    ]
    bound = chat.bind_tools([TRACK_ORDER])
    off = bound.invoke(history, speculative_decoding="off", max_tokens=64)
    on = bound.invoke(history, speculative_decoding="prompt_lookup", max_tokens=64)
    assert on.content == off.content
    assert [(c["name"], c["args"]) for c in on.tool_calls] == [
        (c["name"], c["args"]) for c in off.tool_calls]


QUESTIONS = [
    [HumanMessage(f"The tool returned: {TOOL_RESULT} What is the tracking number?")],
    [HumanMessage("Write two sentences about the sea.")],
    COPY,
    [HumanMessage(f"Summarise in one sentence: {TOOL_RESULT}")],
]


def test_concurrent_replies_identical_on_and_off(chat):
    off = chat.batch(QUESTIONS, speculative_decoding="off", max_tokens=48)
    on = chat.batch(QUESTIONS, speculative_decoding="prompt_lookup", max_tokens=48)
    assert [m.content for m in on] == [m.content for m in off]
    assert sum(m.response_metadata["speculative"]["accepted_tokens"] for m in on) > 0


def test_preempted_replies_identical_on_and_off():
    # 24 blocks of 16 tokens cannot hold four ~160-token requests at once: as they grow,
    # some are preempted and recomputed
    small = AscendChatModel(**smollm2_chat_kwargs(max_tokens=64, num_kv_blocks=24,
                                                  block_size=16, max_context_length=384,
                                                  quantization="none"))
    off = small.batch(QUESTIONS, speculative_decoding="off")
    on = small.batch(QUESTIONS, speculative_decoding="prompt_lookup")
    assert [m.content for m in on] == [m.content for m in off]
    stats = small._engine_for().stats()
    assert stats.num_preemptions > 0 and stats.num_draft_tokens > 0
    assert stats.num_blocks_used == 0
