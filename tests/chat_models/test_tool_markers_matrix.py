"""Forced tool calls survive every way a vocabulary spells the call markers.

Matrix: marker kind (one special added token, one non-special added token, plain text of
several tokens) x tool-call format (Hermes, Llama-3 JSON, Mistral, the fallback of a template
that ignores tools) x speculation (``auto``: jump-forward and drafts, ``prompt_lookup``,
``off``) x ``invoke`` / ``stream`` / ``astream`` / ``batch``: every cell gives a valid parsed
call, and the call paths of one mode give the same calls. Forced rows never draft, so
``auto`` and ``prompt_lookup`` (both jump forward) agree exactly; ``off`` may spell the forced
text in other tokens than the tokenizer's own split that jump-forward appends, so a random
model's free argument text may differ there — each mode is compared with itself. A marker
token the decoder dropped (special tokens are skipped from text) once turned 10 of 10 forced
calls into plain text whenever jump-forward appended the marker.
"""

from __future__ import annotations

import asyncio

import pytest
from chat_test_tools import get_weather
from langchain_core.messages import AIMessageChunk

from langchain_ascend.chat.tool_parsers import TOOL_CALL_MARKERS
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing.marker_tokens import MARKER_KINDS, build_marker_model

# format label -> (tool_call_format setting, chat template, markers the vocabulary spells)
FORMATS = {
    "hermes": ("hermes", "tools", TOOL_CALL_MARKERS["hermes"]),
    "llama3_json": ("llama3_json", "tools", TOOL_CALL_MARKERS["llama3_json"]),
    "mistral": ("mistral", "tools", TOOL_CALL_MARKERS["mistral"]),
    "fallback": ("auto", "no_tools", TOOL_CALL_MARKERS["hermes"]),
}
SPECULATION = ("auto", "prompt_lookup", "off")
PROMPTS = ("What's the weather in Paris for the next days?", "Forecast for Oslo, please.")


def _calls(message):
    return [(call["name"], call["args"]) for call in message.tool_calls]


def _streamed(llm, prompt):
    chunks = list(llm.stream(prompt))
    return _calls(sum(chunks[1:], chunks[0]))


def _astreamed(llm, prompt):
    async def run():
        total: AIMessageChunk | None = None
        async for chunk in llm.astream(prompt):
            total = chunk if total is None else total + chunk
        return total

    return _calls(asyncio.run(run()))


def _check_valid(calls, where):
    assert calls, f"{where}: no parsed tool call"
    for name, args in calls:
        assert name == "get_weather", where
        get_weather.args_schema.model_validate(args)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", MARKER_KINDS)
def test_forced_calls_agree_across_speculation_and_call_paths(kind, fmt):
    setting, template, markers = FORMATS[fmt]
    path = build_marker_model(kind, markers, chat_template=template)
    references: dict[bool, list] = {}
    for speculation in SPECULATION:
        llm = AscendChatModel(budget_closed_output="complete",
            model=str(path), device="cpu", temperature=0, max_tokens=48,
            speculative_decoding=speculation, tool_call_format=setting,
        ).bind_tools([get_weather], tool_choice="required")
        invoked = llm.invoke(PROMPTS[0])
        assert invoked.response_metadata["finish_reason"] == "tool_calls", invoked
        calls = _calls(invoked)
        _check_valid(calls, f"{kind}/{fmt}/{speculation}/invoke")
        reference = references.setdefault(speculation == "off", calls)
        where = f"{kind}/{fmt}/{speculation}"
        assert calls == reference, f"{where}/invoke"
        assert _streamed(llm, PROMPTS[0]) == reference, f"{where}/stream"
        assert _astreamed(llm, PROMPTS[0]) == reference, f"{where}/astream"
        first, second = llm.batch(list(PROMPTS))
        assert _calls(first) == reference, f"{where}/batch"
        _check_valid(_calls(second), f"{where}/batch[1]")


def test_sampled_forced_calls_with_special_markers_under_default_settings():
    """The reported case: Hermes markers as special tokens, default speculation, sampling."""
    path = build_marker_model("special", TOOL_CALL_MARKERS["hermes"])
    llm = AscendChatModel(budget_closed_output="complete", model=str(path), device="cpu", temperature=0.8, max_tokens=64)
    bound = llm.bind_tools([get_weather], tool_choice="required")
    for seed in range(10):
        message = bound.invoke(PROMPTS[0], seed=seed)
        _check_valid(_calls(message), f"seed {seed}")
        assert message.content == "", f"seed {seed}: marker text leaked into content"
        assert message.response_metadata["finish_reason"] == "tool_calls"
