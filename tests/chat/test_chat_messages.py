"""LangChain messages/tools -> chat-template dicts and prompts, and the typed errors."""

from __future__ import annotations

import copy

import pytest
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from langchain_ascend.chat.messages import (
    content_to_text,
    merge_consecutive_roles,
    render_prompt,
    to_template_messages,
    to_template_tools,
)
from langchain_ascend.errors import (
    ChatTemplateError,
    InvalidRequestError,
    LangChainAscendError,
    UnsupportedContentError,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Search(BaseModel):
    """Search the web."""

    query: str = Field(description="what to look for")


def search_docs(topic: str, limit: int = 3) -> list[str]:
    """Search the docs.

    Args:
        topic: Topic to look up.
        limit: Most results.
    """
    return []


def test_roles_tool_calls_and_tool_results():
    messages = [
        SystemMessage("Be brief."),
        HumanMessage("What is 1 + 2?", name="alice"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}]),
        ToolMessage("3", tool_call_id="c1"),
        AIMessage("It is 3.", additional_kwargs={"reasoning_content": "easy"}),
        ChatMessage(role="user", content="Thanks"),
    ]
    assert to_template_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 2?", "name": "alice"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "c1",
             "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"},
        {"role": "assistant", "content": "It is 3.", "reasoning_content": "easy"},
        {"role": "user", "content": "Thanks"},
    ]


def test_text_blocks_are_joined_and_assistant_side_blocks_dropped():
    human = HumanMessage([{"type": "text", "text": "Describe", "cache_control": {"type": "x"}},
                          "this."])
    ai = AIMessage(
        [{"type": "thinking", "thinking": "hmm", "signature": "s"},
         {"type": "text", "text": "Sure."},
         {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1, "b": 1}}],
        tool_calls=[{"name": "add", "args": {"a": 1, "b": 1}, "id": "t1"}],
    )
    rendered = to_template_messages([human, ai])
    assert rendered[0]["content"] == "Describe\nthis."
    assert rendered[1]["content"] == "Sure."
    assert rendered[1]["tool_calls"][0]["function"]["name"] == "add"


def test_tool_result_json_blocks_are_serialised():
    text = content_to_text([{"result": 3}, {"type": "text", "text": "ok"}], role="tool", index=2)
    assert text == '{"result": 3}\nok'


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "base64": "AAAA", "mime_type": "application/pdf"},
    ],
)
def test_non_text_content_is_a_typed_error_naming_the_block(block):
    with pytest.raises(UnsupportedContentError, match=repr(block["type"])) as info:
        to_template_messages([SystemMessage("s"), HumanMessage([{"type": "text", "text": "x"},
                                                                block])])
    assert "message 1" in str(info.value)
    assert isinstance(info.value, LangChainAscendError) and isinstance(info.value, ValueError)


def test_empty_conversation_is_a_typed_error():
    with pytest.raises(InvalidRequestError, match="empty"):
        to_template_messages([])


def test_tool_message_without_a_matching_call_is_a_typed_error():
    with pytest.raises(InvalidRequestError, match="tool_call_id='nope'"):
        to_template_messages([HumanMessage("hi"), ToolMessage("3", tool_call_id="nope")])
    with pytest.raises(InvalidRequestError, match="known ids: \\['c1'\\]"):
        to_template_messages([
            HumanMessage("hi"),
            AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
            ToolMessage("3", tool_call_id="c2"),
        ])


def test_unsupported_message_type_is_a_typed_error():
    with pytest.raises(InvalidRequestError, match="'function'"):
        to_template_messages([FunctionMessage(content="x", name="f")])


def test_tools_in_every_langchain_shape_convert_to_openai_format():
    openai_dict = {"type": "function", "function": {
        "name": "lookup", "description": "Look up.",
        "parameters": {"type": "object", "properties": {"k": {"type": "string"}},
                       "required": ["k"]}}}
    anthropic_dict = {"name": "pick", "description": "Pick a color.",
                      "input_schema": {"type": "object",
                                       "properties": {"color": {"type": "string"}}}}
    tools = to_template_tools([add, Search, search_docs, openai_dict, anthropic_dict])
    assert [t["function"]["name"] for t in tools] == [
        "add", "Search", "search_docs", "lookup", "pick"]
    assert tools[1]["function"]["parameters"]["properties"]["query"]["type"] == "string"
    assert tools[2]["function"]["parameters"]["required"] == ["topic"]
    assert all(t["type"] == "function" for t in tools)


def test_unconvertible_tool_is_a_typed_error():
    with pytest.raises(InvalidRequestError, match="cannot convert tool"):
        to_template_tools([42])


def test_an_invalid_call_renders_as_its_text_and_may_be_answered():
    raw = '<tool_call>\n{"name": "add", "arguments": {"a": 1'
    messages = to_template_messages([
        HumanMessage("Add."),
        AIMessage("", invalid_tool_calls=[{"type": "invalid_tool_call", "id": "call_cut",
                                           "name": "add", "args": raw, "error": "cut"}]),
        ToolMessage("could not run", tool_call_id="call_cut", status="error"),
    ])
    assert messages[1] == {"role": "assistant", "content": raw}
    assert messages[2]["tool_call_id"] == "call_cut" and messages[2]["name"] == "add"


def test_render_with_tools_matches_the_qwen_layout(tokenizer):
    messages = to_template_messages([
        HumanMessage("What is 1 + 2?"),
        AIMessage("Let me add.", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2},
                                              "id": "c1"}]),
        ToolMessage("3", tool_call_id="c1"),
    ])
    prompt = render_prompt(tokenizer, messages, tools=to_template_tools([add]))
    assert "# Tools" in prompt and '"name": "add"' in prompt
    assert ('<|im_start|>assistant\nLet me add.\n<tool_call>\n{"name": "add", "arguments": '
            '{"a": 1, "b": 2}}\n</tool_call><|im_end|>') in prompt
    assert "<tool_response>\n3\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_template_kwargs_reach_the_template(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{{ messages[0]['content'] }}|{{ flavour }}"
    assert render_prompt(tok, [{"role": "user", "content": "x"}],
                         template_kwargs={"flavour": "mint"}) == "x|mint"


def test_missing_chat_template_is_a_typed_error(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_prompt(tok, [{"role": "user", "content": "hi"}])


def test_strict_template_gets_merged_roles_and_still_reports_what_it_rejects(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if loop.index0 > 0 and m.role == messages[loop.index0 - 1].role"
        " %}{{ raise_exception('roles must alternate') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}"
    )
    messages = to_template_messages([HumanMessage("a"), HumanMessage("b"), AIMessage("c")])
    assert render_prompt(tok, messages) == "[user]a\n\nb[assistant]c"
    tok.chat_template = "{{ raise_exception('only text please') }}"
    with pytest.raises(ChatTemplateError, match="only text please"):
        render_prompt(tok, messages)


def test_merge_keeps_tool_call_messages_apart():
    messages = [
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "1"}]},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "x"},
        {"role": "user", "content": ""},
    ]
    assert merge_consecutive_roles(messages) == [
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "1"}]},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "x"},
    ]
