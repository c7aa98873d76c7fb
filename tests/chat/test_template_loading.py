"""``chat_template=``: reading the argument (a Jinja string or a file) and the tokenizer view
that renders with it without touching the engine's tokenizer. No model is loaded here."""

from __future__ import annotations

from pathlib import Path

import pytest

from langchain_ascend.chat.messages import render_prompt
from langchain_ascend.chat.template import (
    TemplatedTokenizer,
    load_chat_template,
    template_stop_token_ids,
    with_chat_template,
)
from langchain_ascend.engine.hf_config import end_of_turn_token_ids
from langchain_ascend.errors import ChatTemplateError, InvalidArgumentTypeError
from langchain_ascend.testing import build_tokenizer, chat_template, load_tokenizer

SIMPLE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}")
USER = [{"role": "user", "content": "hi"}]


def tiny_tokenizer():
    """A fresh copy of the tiny test tokenizer (its ChatML template renders tools)."""
    return load_tokenizer(build_tokenizer())


def test_a_jinja_string_is_the_template():
    assert load_chat_template(SIMPLE) == SIMPLE
    assert load_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    assert load_chat_template(None) is None


@pytest.mark.parametrize("as_path", [str, Path])
def test_a_file_holding_a_template_is_read(tmp_path, as_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(chat_template(), encoding="utf-8")
    assert load_chat_template(as_path(path)) == chat_template()


def test_a_file_name_without_a_suffix_is_read_too(tmp_path):
    path = tmp_path / "template"
    path.write_text(SIMPLE, encoding="utf-8")
    assert load_chat_template(str(path)) == SIMPLE


def test_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.jinja").write_text(SIMPLE, encoding="utf-8")
    assert load_chat_template("~/t.jinja") == SIMPLE


@pytest.mark.parametrize("value", ["templates/missing.jinja", "./missing", "missing.j2",
                                   "/no/such/dir/chat_template.jinja", "~/nope.jinja"])
def test_a_missing_path_is_a_typed_error_naming_the_argument(value):
    with pytest.raises(ChatTemplateError, match="chat_template=") as info:
        load_chat_template(value)
    assert "no file" in str(info.value)
    assert repr(value) in str(info.value)


def test_a_word_that_is_neither_template_nor_file_is_refused():
    with pytest.raises(ChatTemplateError, match=r"chat_template='chatml' is neither a Jinja"):
        load_chat_template("chatml")
    with pytest.raises(ChatTemplateError, match="chat_template="):
        load_chat_template("")


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(ChatTemplateError, match="is a folder"):
        load_chat_template(str(tmp_path))
    with pytest.raises(ChatTemplateError, match="is a folder"):
        load_chat_template(tmp_path)


def test_a_file_without_a_template_or_not_text_is_refused(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("just words", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="holds no Jinja template"):
        load_chat_template(str(plain))
    binary = tmp_path / "weights.jinja"
    binary.write_bytes(b"\xff\xfe\x00{%")
    with pytest.raises(ChatTemplateError, match="not UTF-8"):
        load_chat_template(str(binary))
    missing = tmp_path / "gone.jinja"
    with pytest.raises(ChatTemplateError, match="no file"):
        load_chat_template(missing)


def test_broken_jinja_is_refused_with_its_line(tmp_path):
    with pytest.raises(ChatTemplateError, match=r"not a valid Jinja template \(line 2\)"):
        load_chat_template("ok\n{% for m in messages %}{{ m.content }")
    path = tmp_path / "broken.jinja"
    path.write_text("{% if x %}unclosed", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="broken.jinja"):
        load_chat_template(str(path))


@pytest.mark.parametrize("value", [123, True, ["{{ x }}"], b"{{ x }}"])
def test_a_wrong_type_is_a_type_error(value):
    with pytest.raises(InvalidArgumentTypeError, match="chat_template="):
        load_chat_template(value)


def test_the_view_renders_with_the_template_and_leaves_the_tokenizer_alone():
    tokenizer = tiny_tokenizer()
    own = tokenizer.chat_template
    view = with_chat_template(tokenizer, SIMPLE)
    assert isinstance(view, TemplatedTokenizer) and view.tokenizer is tokenizer
    assert view.chat_template == SIMPLE
    assert render_prompt(view, USER) == "[user]hi[assistant]"
    assert tokenizer.chat_template == own  # not modified
    assert render_prompt(tokenizer, USER).startswith("<|im_start|>")
    assert view.encode("hi", add_special_tokens=False) == tokenizer.encode(
        "hi", add_special_tokens=False)
    assert with_chat_template(tokenizer, None) is tokenizer


def test_a_tokenizer_without_a_template_names_the_argument():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError) as info:
        render_prompt(tokenizer, USER)
    message = str(info.value)
    assert "pass chat_template= (a Jinja string or file) to AscendChatModel" in message
    assert "model.chat_template in the config" in message
    assert render_prompt(with_chat_template(tokenizer, SIMPLE), USER) == "[user]hi[assistant]"


def test_end_of_turn_tokens_of_a_template():
    tokenizer = tiny_tokenizer()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert template_stop_token_ids(tokenizer, chat_template()) == [im_end]
    assert template_stop_token_ids(tokenizer, SIMPLE) == []
    assert template_stop_token_ids(tokenizer, None) == []
    # a marker the vocabulary lacks is not mapped to <unk>
    assert end_of_turn_token_ids("{{ x }}<|eot_id|>", tokenizer) == []
