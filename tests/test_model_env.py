"""One model variable: LANGCHAIN_ASCEND_MODEL, the old LANGCHAIN_ASCEND_CHAT_MODEL with a
DeprecationWarning (langchain_ascend.model_env)."""

from __future__ import annotations

import warnings

import pytest

from langchain_ascend.errors import ModelSourceError
from langchain_ascend.model_env import (
    DEPRECATED_MODEL_ENV_VAR,
    MODEL_ENV_VAR,
    model_from_env,
)


@pytest.fixture(autouse=True)
def no_model_variables(monkeypatch):
    monkeypatch.delenv(MODEL_ENV_VAR, raising=False)
    monkeypatch.delenv(DEPRECATED_MODEL_ENV_VAR, raising=False)


def test_the_model_variable_is_read_without_a_warning(monkeypatch):
    monkeypatch.setenv(MODEL_ENV_VAR, "/models/new")
    monkeypatch.setenv(DEPRECATED_MODEL_ENV_VAR, "/models/old")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_from_env() == "/models/new"


def test_the_old_variable_still_works_with_a_deprecation_warning(monkeypatch):
    monkeypatch.setenv(DEPRECATED_MODEL_ENV_VAR, "/models/old")
    with pytest.warns(DeprecationWarning, match=f"set {MODEL_ENV_VAR} instead"):
        assert model_from_env() == "/models/old"


def test_neither_set_names_the_variable_or_gives_none():
    assert model_from_env(required=False) is None
    with pytest.raises(ModelSourceError, match=MODEL_ENV_VAR):
        model_from_env()


def test_the_chat_model_reads_the_variable(monkeypatch, tiny_qwen2_path):
    from langchain_ascend import AscendChatModel

    monkeypatch.setenv(MODEL_ENV_VAR, str(tiny_qwen2_path))
    assert AscendChatModel(device="cpu").model == str(tiny_qwen2_path)
    monkeypatch.delenv(MODEL_ENV_VAR)
    monkeypatch.setenv(DEPRECATED_MODEL_ENV_VAR, str(tiny_qwen2_path))
    with pytest.warns(DeprecationWarning):
        assert AscendChatModel(device="cpu").model == str(tiny_qwen2_path)
    monkeypatch.delenv(DEPRECATED_MODEL_ENV_VAR)
    with pytest.raises(ModelSourceError, match=MODEL_ENV_VAR):
        AscendChatModel(device="cpu")
