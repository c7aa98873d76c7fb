"""The tiny tokenizers' chat template renders tools and tool calls exactly like Qwen2.5-Instruct."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}

# The "# Tools" block Qwen2.5-Instruct appends to the first system turn, with both tools.
TOOLS_BLOCK = (
    "\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current '
    'weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": '
    '"string", "description": "City name."}}, "required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": '
    '"integer"}}, "required": ["a", "b"]}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


def _render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_tools_tool_call_and_grouped_tool_results(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            ],
        },
        {"role": "tool", "content": '{"temperature": 21, "condition": "sunny"}'},
        {"role": "tool", "content": "5"},
    ]
    rendered = _render(tokenizer, messages, tools=[WEATHER_TOOL, ADD_TOOL], add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\n" + DEFAULT_SYSTEM + TOOLS_BLOCK + "<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n"
        '<tool_response>\n{"temperature": 21, "condition": "sunny"}\n</tool_response>\n'
        "<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_own_system_prompt_with_tools_and_final_answer(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        },
        {"role": "tool", "content": "snow"},
        {"role": "assistant", "content": "It is snowing in Oslo."},
    ]
    rendered = _render(tokenizer, messages, tools=[WEATHER_TOOL, ADD_TOOL])
    assert rendered == (
        "<|im_start|>system\nYou answer briefly." + TOOLS_BLOCK + "<|im_end|>\n"
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsnow\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is snowing in Oslo.<|im_end|>\n"
    )


def test_string_arguments_are_json_quoted_like_qwen(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
            ],
        },
    ]
    rendered = _render(tokenizer, messages, tools=[ADD_TOOL])
    assert rendered.endswith(
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call><|im_end|>\n'
    )


def test_plain_chat_without_tools(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Bye"},
    ]
    assert _render(tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_system_first_and_later_system_turn(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Now be polite."},
    ]
    assert _render(tokenizer, messages) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>system\nNow be polite.<|im_end|>\n"
    )


def test_tool_result_right_after_system_opens_user_turn(tokenizer) -> None:
    messages = [{"role": "tool", "content": "42"}]
    assert _render(tokenizer, messages) == (
        "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    )


def test_rendered_control_tokens_encode_as_single_ids(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {}}]},
        {"role": "tool", "content": "y"},
    ]
    ids = tokenizer.apply_chat_template(messages, tools=[ADD_TOOL], add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert tokenizer.convert_tokens_to_ids(token) in ids, token
    assert tokenizer.decode(ids) == _render(
        tokenizer, messages, tools=[ADD_TOOL], add_generation_prompt=True
    )
