"""Does a chat template render tools; the fallback rewrite of prompts and history (no model)."""

from __future__ import annotations

import copy
import json
import logging

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from transformers import AutoTokenizer

from langchain_ascend.chat import tool_support
from langchain_ascend.chat.messages import render_prompt, to_template_messages, to_template_tools
from langchain_ascend.chat.tool_support import (
    ToolSupport,
    apply_fallback,
    check_tools_usable,
    resolve_tool_support,
    template_renders_tools,
)
from langchain_ascend.errors import ChatTemplateError
from langchain_ascend.testing import build_model, chat_template_without_tools


def get_weather(city: str, days: int) -> str:
    """Weather forecast for a city over a number of days."""
    return "sunny"


TOOLS = to_template_tools([get_weather])


@pytest.fixture(scope="module")
def native_tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@pytest.fixture(scope="module")
def plain_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(build_model("tiny", "qwen2",
                                                          chat_template="no_tools"))
    assert tokenizer.chat_template == chat_template_without_tools()
    return tokenizer


def test_the_tool_less_variant_is_its_own_cached_model(tiny_qwen2_path):
    plain = build_model("tiny", "qwen2", chat_template="no_tools")
    assert plain != tiny_qwen2_path and plain.name.startswith("qwen2-tiny-seed0-no-tools-")
    assert (plain / "model.safetensors").read_bytes() == (
        tiny_qwen2_path / "model.safetensors").read_bytes()  # same weights
    with pytest.raises(ValueError, match="unknown chat_template"):
        build_model("tiny", "qwen2", chat_template="gemma")


def test_detection_on_both_template_kinds(native_tokenizer, plain_tokenizer):
    assert template_renders_tools(native_tokenizer) is True
    assert template_renders_tools(plain_tokenizer) is False
    raising = copy.deepcopy(native_tokenizer)
    raising.chat_template = "{% if tools %}{{ raise_exception('no tools') }}{% endif %}x"
    assert template_renders_tools(raising) is False
    missing = copy.deepcopy(native_tokenizer)
    missing.chat_template = None
    assert template_renders_tools(missing) is False


def test_detection_is_cached_per_template_source(native_tokenizer, monkeypatch):
    tok = copy.deepcopy(native_tokenizer)
    tok.chat_template = "{{ tools[0].function.name if tools else '' }}|cached-probe-template"
    calls = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    assert template_renders_tools(tok) and template_renders_tools(tok)
    assert len(calls) == 1


def test_resolution_and_override(native_tokenizer, plain_tokenizer):
    assert resolve_tool_support(native_tokenizer, "auto") == ToolSupport("hermes", False, True)
    assert resolve_tool_support(plain_tokenizer, "auto") == ToolSupport("hermes", True, False)
    assert resolve_tool_support(plain_tokenizer, "hermes") == ToolSupport("hermes", True, False)
    # "fallback" forces our rendering even where the template has its own.
    assert resolve_tool_support(native_tokenizer, "fallback") == ToolSupport("hermes", True, True)
    # An explicit format is kept for a template that renders tools...
    assert resolve_tool_support(native_tokenizer, "mistral") == ToolSupport("mistral", False, True)
    # ...but cannot work where the template ignores tools: a typed error naming it.
    broken = resolve_tool_support(plain_tokenizer, "llama3_json")
    assert not broken.usable
    with pytest.raises(ChatTemplateError, match="'my-model' does not render tools.*tool_call_format='llama3_json'"):
        check_tools_usable(broken, "llama3_json", model_name="my-model")
    check_tools_usable(resolve_tool_support(plain_tokenizer, "auto"), "auto", model_name="m")


def test_the_path_is_logged_once_per_model_and_template(plain_tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(tool_support, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger="langchain_ascend.chat.tool_support"):
        for _ in range(3):
            resolve_tool_support(plain_tokenizer, "auto", model_name="smol")
        resolve_tool_support(plain_tokenizer, "auto", model_name="other")
    records = [r for r in caplog.records if r.name == "langchain_ascend.chat.tool_support"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert "smol" in records[0].getMessage() and "fallback" in records[0].getMessage()


def test_bound_tools_go_into_the_system_turn_only_for_the_fallback(plain_tokenizer):
    plain = render_prompt(plain_tokenizer, apply_fallback(
        to_template_messages([HumanMessage("Weather?")]), None))
    with_tools = render_prompt(plain_tokenizer, apply_fallback(
        to_template_messages([HumanMessage("Weather?")]), TOOLS))
    assert "get_weather" not in plain and "<tools>" not in plain
    assert with_tools.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(TOOLS[0]) in with_tools
    assert len(plain_tokenizer.encode(with_tools)) > len(plain_tokenizer.encode(plain))
    # The template alone would have dropped them.
    assert "get_weather" not in render_prompt(
        plain_tokenizer, to_template_messages([HumanMessage("Weather?")]), tools=TOOLS)


def test_the_tools_section_is_prepended_to_an_existing_system_message():
    messages = apply_fallback([{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "x"}], TOOLS)
    assert len(messages) == 2 and messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("# Tools\n")
    assert messages[0]["content"].endswith("\n\nBe brief.")


def test_history_of_calls_and_results_is_readable_by_a_tool_less_template(plain_tokenizer):
    history = [
        SystemMessage("Be brief."),
        HumanMessage("Weather in Paris and Rome?"),
        AIMessage("Checking.", tool_calls=[
            {"name": "get_weather", "args": {"city": "Paris", "days": 1}, "id": "call_p"},
            {"name": "get_weather", "args": {"city": "Rome", "days": 2}, "id": "call_r"}]),
        ToolMessage("sunny in Paris", tool_call_id="call_p"),
        ToolMessage("rain in Rome", tool_call_id="call_r"),
        HumanMessage("Thanks, and tomorrow?"),
    ]
    template_messages = to_template_messages(history)
    original = copy.deepcopy(template_messages)
    rewritten = apply_fallback(template_messages, TOOLS)
    assert template_messages == original  # the input is left alone
    assert [m["role"] for m in rewritten] == ["system", "user", "assistant", "user", "user"]
    assert all("tool_calls" not in m for m in rewritten)
    prompt = render_prompt(plain_tokenizer, rewritten)
    assert ('<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 1}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Rome", "days": 2}}\n</tool_call><|im_end|>') in prompt
    # Both results in one user turn, each with its tool name and call id.
    assert ('<|im_start|>user\n<tool_response>\n{"name": "get_weather", "tool_call_id": '
            '"call_p", "content": "sunny in Paris"}\n</tool_response>\n<tool_response>\n'
            '{"name": "get_weather", "tool_call_id": "call_r", "content": "rain in Rome"}\n'
            "</tool_response><|im_end|>") in prompt
    assert "<|im_start|>tool" not in prompt


def test_native_templates_keep_their_own_rendering(native_tokenizer):
    messages = to_template_messages([
        HumanMessage("What is 1 + 2?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "a", "days": 1},
                                   "id": "c1"}]),
        ToolMessage("3", tool_call_id="c1"),
    ])
    support = resolve_tool_support(native_tokenizer, "auto")
    assert not support.fallback
    prompt = render_prompt(native_tokenizer, messages, tools=TOOLS)
    assert "<tool_response>\n3\n</tool_response>" in prompt  # Qwen2.5's layout, not ours
    assert "tool_call_id" not in prompt
