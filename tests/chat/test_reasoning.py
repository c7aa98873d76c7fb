"""Splitting <think> reasoning from the answer, whole and streamed (pure)."""

from __future__ import annotations

import pytest

from langchain_ascend.chat.reasoning import (
    ReasoningSplitter,
    prompt_opens_reasoning,
    split_reasoning,
)
from langchain_ascend.chat.reply import ReplyAssembler, reply_marker_ids

QWEN3 = "<think>\nThe user greets me.\nI should greet back.\n</think>\n\nHello! How can I help?"


def test_qwen3_reply_splits_into_reasoning_and_answer():
    reasoning, content = split_reasoning(QWEN3)
    assert reasoning == "The user greets me.\nI should greet back."
    assert content == "Hello! How can I help?"


def test_reply_without_think_is_all_content_and_disabled_splitter_passes_through():
    assert split_reasoning("Hi <think>not at start</think>") == ("", "Hi <think>not at start</think>")
    assert split_reasoning(QWEN3, enabled=False) == ("", QWEN3)


def test_prompt_that_opens_think_starts_in_reasoning():
    prompt = "<|im_start|>assistant\n<think>\n"
    assert prompt_opens_reasoning(prompt)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert split_reasoning("plan\n</think>\nanswer", start_in_reasoning=True) == ("plan", "answer")


def test_cut_off_reasoning_has_no_content():
    assert split_reasoning("<think>still thinking") == ("still thinking", "")


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_streamed_split_matches_whole(step):
    splitter = ReasoningSplitter()
    reasoning = content = ""
    for i in range(0, len(QWEN3), step):
        delta = splitter.feed(QWEN3[i : i + step])
        reasoning += delta.reasoning
        content += delta.content
    tail = splitter.finish()
    assert (reasoning + tail.reasoning, content + tail.content) == split_reasoning(QWEN3)


def test_assembler_routes_reasoning_then_tool_calls():
    text = ('<think>need weather</think>\nChecking.\n<tool_call>\n{"name": "w", "arguments": '
            '{"c": "Rome"}}\n</tool_call>')
    assembler = ReplyAssembler(parse_tools=True, tool_format="hermes", tool_names=["w"])
    pieces = [assembler.feed(ch) for ch in text] + [assembler.finish()]
    assert "".join(p.reasoning for p in pieces) == "need weather"
    assert "".join(p.content for p in pieces) == "Checking."
    assert [c.args for p in pieces for c in p.calls] == [{"c": "Rome"}]
    assert assembler.content == "Checking." and assembler.reasoning == "need weather"


def test_tool_calls_inside_reasoning_are_not_calls():
    text = '<think><tool_call>{"name": "w", "arguments": {}}</tool_call></think>Done.'
    assembler = ReplyAssembler(parse_tools=True, tool_format="hermes")
    assembler.feed(text)
    assembler.finish()
    assert assembler.calls == []
    assert assembler.content == "Done."


def test_reply_keeps_the_markers_of_its_format_and_of_reasoning():
    special = {"[TOOL_CALLS]": 99, "<|im_end|>": 2, "<tool_call>": 7, "</tool_call>": 8,
               "<think>": 5, "</think>": 6}
    hermes = reply_marker_ids(special, tool_format="hermes", parse_tools=True,
                              parse_reasoning=False)
    assert hermes == {7, 8}
    every = reply_marker_ids(special, tool_format="auto", parse_tools=True,
                             parse_reasoning=True)
    assert every == {99, 7, 8, 5, 6}  # never the end-of-turn token
    assert reply_marker_ids(special, tool_format="mistral", parse_tools=False,
                            parse_reasoning=False) == frozenset()
