"""A model without a chat template (a base model's tokenizer): ``chat_template=`` (a Jinja
string or a file) and the config's ``model.chat_template`` make it answer; without them the
error names the argument. The template never leaks into another chat model's engine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from chat_test_tools import get_weather
from langchain_core.messages import HumanMessage
from pydantic import ValidationError

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.config import load_config
from langchain_ascend.errors import ChatTemplateError, InvalidArgumentTypeError
from langchain_ascend.testing import chat_template

SIMPLE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}")
HELLO = [HumanMessage("hello")]


@pytest.fixture(scope="module")
def templateless_path(tiny_qwen2_path, tmp_path_factory) -> Path:
    """The tiny qwen2 model with its tokenizer's chat template removed (a base model)."""
    out = tmp_path_factory.mktemp("templateless") / "model"
    out.mkdir()
    for item in Path(tiny_qwen2_path).iterdir():
        if item.name == "chat_template.jinja":
            continue
        if item.name == "model.safetensors":
            os.symlink(item, out / item.name)
        else:
            shutil.copy(item, out / item.name)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    from transformers import AutoTokenizer

    assert not AutoTokenizer.from_pretrained(out).chat_template
    return out


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("templates") / "chatml.jinja"
    path.write_text(chat_template(), encoding="utf-8")
    return path


def _chat(path, **kwargs) -> AscendChatModel:
    return AscendChatModel(**{"model": str(path), "device": "cpu", "temperature": 0,
                              "max_tokens": 4, "budget_closed_output": "complete", **kwargs})


def test_without_a_template_the_error_names_the_argument(templateless_path):
    llm = _chat(templateless_path)
    for call in (lambda: llm.invoke("hello"), lambda: list(llm.stream("hello"))):
        with pytest.raises(ChatTemplateError) as info:
            call()
        message = str(info.value)
        assert "pass chat_template= (a Jinja string or file) to AscendChatModel" in message
        assert "model.chat_template in the config" in message


def test_a_template_string_answers_like_the_model_that_has_it(templateless_path,
                                                              tiny_qwen2_path):
    given = _chat(templateless_path, chat_template=chat_template())
    own = _chat(tiny_qwen2_path)
    assert given._prepare(HELLO, None, {}).prompt_token_ids == \
        own._prepare(HELLO, None, {}).prompt_token_ids
    reply = given.invoke(HELLO)
    assert reply.usage_metadata["output_tokens"] >= 1
    assert reply.content == own.invoke(HELLO).content  # same weights, same prompt, greedy


@pytest.mark.parametrize("as_path", [str, Path])
def test_a_template_file_answers(templateless_path, tiny_qwen2_path, template_file, as_path):
    given = _chat(templateless_path, chat_template=as_path(template_file))
    own = _chat(tiny_qwen2_path)
    assert given._prepare(HELLO, None, {}).prompt_token_ids == \
        own._prepare(HELLO, None, {}).prompt_token_ids
    assert given.invoke(HELLO).usage_metadata["output_tokens"] >= 1


def test_tools_work_with_a_given_template(templateless_path):
    llm = _chat(templateless_path, chat_template=chat_template(), max_tokens=64)
    bound = llm.bind_tools([get_weather], tool_choice="required")
    prepared = llm._prepare([HumanMessage("Weather in Paris?")], None, bound.kwargs)
    prompt = prepared.engine.tokenizer.decode(prepared.prompt_token_ids)
    assert '"name": "get_weather"' in prompt  # the template rendered the tool schema
    message = bound.invoke("Weather in Paris for 2 days?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    get_weather.args_schema.model_validate(message.tool_calls[0]["args"])
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_the_template_ends_replies_at_its_end_of_turn_token(templateless_path):
    llm = _chat(templateless_path, chat_template=chat_template())
    prepared = llm._prepare(HELLO, None, {})
    im_end = prepared.engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert prepared.params.stop_token_ids == [im_end]
    assert llm._prepare(HELLO, None, {"ignore_eos": True}).params.stop_token_ids == []
    assert _chat(templateless_path, chat_template=SIMPLE)._prepare(
        HELLO, None, {}).params.stop_token_ids == []


def test_a_template_does_not_leak_into_a_shared_engine(tiny_qwen2_path):
    own = _chat(tiny_qwen2_path)
    other = _chat(tiny_qwen2_path, chat_template=SIMPLE)
    engine = own._engine_for()
    assert other._engine_for() is engine  # one engine: same weights, same KV cache
    before = engine.tokenizer.chat_template
    other_prompt = other._prepare(HELLO, None, {})
    own_prompt = own._prepare(HELLO, None, {})
    decode = engine.tokenizer.decode
    assert decode(other_prompt.prompt_token_ids) == "[user]hello[assistant]"
    assert decode(own_prompt.prompt_token_ids).startswith("<|im_start|>")
    assert engine.tokenizer.chat_template == before
    assert other.invoke(HELLO).usage_metadata["input_tokens"] == len(
        other_prompt.prompt_token_ids)


def test_a_per_call_model_keeps_its_own_template(templateless_path, tiny_qwen2_path):
    llm = _chat(templateless_path, chat_template=SIMPLE)
    prepared = llm._prepare(HELLO, None, {"model": str(tiny_qwen2_path)})
    assert prepared.engine.tokenizer.decode(prepared.prompt_token_ids).startswith(
        "<|im_start|>")


def test_bad_chat_template_arguments_are_typed_errors(tiny_qwen2_path, tmp_path):
    with pytest.raises(ChatTemplateError, match=r"chat_template='templates/chatml\.jinja'"):
        _chat(tiny_qwen2_path, chat_template="templates/chatml.jinja")
    with pytest.raises(ChatTemplateError, match="chat_template="):
        _chat(tiny_qwen2_path, chat_template=tmp_path / "missing.jinja")
    with pytest.raises(ChatTemplateError, match="not a valid Jinja template"):
        _chat(tiny_qwen2_path, chat_template="{% for m in messages %}")
    with pytest.raises(ValidationError, match="chat_template") as info:
        _chat(tiny_qwen2_path, chat_template=42)
    causes = [e.get("ctx", {}).get("error") for e in info.value.errors()]
    assert any(isinstance(cause, InvalidArgumentTypeError) for cause in causes), causes


def test_config_model_chat_template(templateless_path, template_file, tmp_path):
    base = {"npu": {"device": "cpu"},
            "model": {"path": str(templateless_path), "max_tokens": 2, "temperature": 0}}
    with pytest.raises(ChatTemplateError, match="chat_template="):
        load_config(base).chat_model.invoke("hello")
    for template in (str(template_file), chat_template()):
        config = {**base, "model": {**base["model"], "chat_template": template}}
        reply = load_config(config).chat_model.invoke("hello")
        assert reply.usage_metadata["output_tokens"] >= 1
    # in a YAML file: a path relative to the file, or the text as a block scalar
    shutil.copy(template_file, tmp_path / "chat.jinja")
    indented = "\n".join("    " + line for line in chat_template().splitlines())
    for value in ("chat.jinja", "|\n" + indented):
        cfg = tmp_path / "agent_config.yaml"
        cfg.write_text(f"npu:\n  device: cpu\nmodel:\n  path: {templateless_path}\n"
                       f"  max_tokens: 2\n  temperature: 0\n  chat_template: {value}\n")
        chat = load_config(cfg).chat_model
        assert chat.invoke("hello").usage_metadata["output_tokens"] >= 1
