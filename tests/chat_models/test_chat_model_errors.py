"""Bad input gets a clear typed error, and the engine keeps serving everyone else."""

from __future__ import annotations

import shutil
import threading

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic import ValidationError
from transformers import AutoTokenizer

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.errors import (
    ChatTemplateError,
    InvalidRequestError,
    LangChainAscendError,
    PromptTooLongError,
    UnsupportedContentError,
)

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

BAD_INPUTS = [
    pytest.param([], {}, InvalidRequestError, "empty", id="empty-conversation"),
    pytest.param([HumanMessage([{"type": "text", "text": "What is this?"}, IMAGE])], {},
                 UnsupportedContentError, "'image_url'", id="image-block"),
    pytest.param([HumanMessage("hi"), ToolMessage("42", tool_call_id="call_x")], {},
                 InvalidRequestError, "call_x", id="tool-message-without-call"),
    pytest.param([HumanMessage("word " * 5000)], {}, PromptTooLongError, "max_context_length",
                 id="prompt-over-context"),
    pytest.param([HumanMessage("hi")], {"max_tokens": 0}, InvalidRequestError, "max_tokens",
                 id="max-tokens-zero"),
    pytest.param([HumanMessage("hi")], {"temperature": -1.0}, InvalidRequestError, "temperature",
                 id="negative-temperature"),
    pytest.param([HumanMessage("hi")], {"top_k_typo": 3}, InvalidRequestError, "top_k_typo",
                 id="unknown-call-argument"),
    pytest.param([HumanMessage("hi")], {"response_format": {"type": "xml"}}, InvalidRequestError,
                 "response_format", id="bad-response-format"),
]


@pytest.mark.parametrize(("messages", "kwargs", "error", "match"), BAD_INPUTS)
def test_bad_input_is_a_typed_error_and_the_next_call_works(tiny_chat, messages, kwargs, error,
                                                             match):
    with pytest.raises(error, match=match) as info:
        tiny_chat.invoke(messages, **kwargs)
    assert isinstance(info.value, LangChainAscendError)
    assert tiny_chat.invoke("still there?", max_tokens=4).usage_metadata["output_tokens"] == 4


async def test_bad_input_fails_the_same_way_async_and_streaming(tiny_chat):
    with pytest.raises(UnsupportedContentError):
        await tiny_chat.ainvoke([HumanMessage([IMAGE])])
    with pytest.raises(PromptTooLongError):
        [c async for c in tiny_chat.astream("word " * 5000)]
    with pytest.raises(InvalidRequestError):
        list(tiny_chat.stream([]))
    assert (await tiny_chat.ainvoke("ok?", max_tokens=3)).usage_metadata["output_tokens"] == 3


def test_bad_requests_do_not_disturb_a_running_one(tiny_chat):
    results = {}

    def long_request():
        results["long"] = tiny_chat.invoke("Tell me a long story", max_tokens=60)

    worker = threading.Thread(target=long_request)
    worker.start()
    for _ in range(5):
        with pytest.raises(LangChainAscendError):
            tiny_chat.invoke([HumanMessage("hi"), ToolMessage("1", tool_call_id="nope")])
        with pytest.raises(PromptTooLongError):
            tiny_chat.invoke("word " * 5000)
    worker.join(timeout=120)
    assert results["long"].usage_metadata["output_tokens"] == 60


def test_constructor_rejects_bad_settings(tiny_qwen2_path):
    # Like every LangChain model, construction errors are pydantic ValidationErrors (ValueError)
    # carrying the message.
    path = str(tiny_qwen2_path)
    with pytest.raises(ValidationError, match="unknown argument.*temprature"):
        AscendChatModel(model=path, temprature=0.5)
    for bad, name in (({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.1}, "temperature"),
                      ({"top_p": 0.0}, "top_p"), ({"top_k": -1}, "top_k"),
                      ({"kv_cache_memory_fraction": 1.5}, "kv_cache_memory_fraction")):
        with pytest.raises(ValidationError, match=name):
            AscendChatModel(model=path, **bad)
    # ChatOpenAI-style arguments that mean nothing locally are accepted for drop-in use, each
    # with a warning naming it.
    with pytest.warns(UserWarning) as caught:
        AscendChatModel(model=path, api_key="unused", timeout=30, max_retries=2)
    said = " ".join(str(w.message) for w in caught)
    for name in ("api_key=", "timeout=", "max_retries="):
        assert name in said and "no effect" in said
    # n: one generation per prompt; n=1 is that, n=2 would leave generations[0][1] missing.
    with pytest.warns(UserWarning, match="n="):
        AscendChatModel(model=path, n=1)
    for n in (2, 0, "2"):
        with pytest.raises(ValidationError, match=r"n=.*one generation per prompt"):
            AscendChatModel(model=path, n=n)


def test_bad_model_sources_fail_at_construction_with_a_typed_error(tmp_path):
    from langchain_ascend.errors import LangChainAscendError, ModelSourceError

    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelSourceError, match=str(missing)) as exc:
        AscendChatModel(model=str(missing), device="cpu")
    assert isinstance(exc.value, LangChainAscendError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="config.json"):
        AscendChatModel(model=str(tmp_path / "empty"), device="cpu")
    corrupt = tmp_path / "model.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelSourceError, match="model.gguf"):
        AscendChatModel(model=str(corrupt), device="cpu")


def test_model_without_chat_template_is_a_clear_error(tiny_qwen2_path, tmp_path):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_qwen2_path, folder)
    (folder / "chat_template.jinja").unlink()
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    model = AscendChatModel(model=str(folder), device="cpu", max_tokens=4)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        model.invoke("hi")
    model._engine_for().shutdown()


def test_failed_structured_parse_is_reported_not_raised_with_include_raw(tiny_chat):
    from pydantic import BaseModel

    class Strict(BaseModel):
        code: int

    # json_mode does not constrain to the schema: a random model's JSON fails to parse.
    llm = tiny_chat.model_copy(update={"max_tokens": 24, "temperature": 1.0, "seed": 0})
    result = llm.with_structured_output(Strict, method="json_mode", include_raw=True).invoke("x")
    assert isinstance(result["raw"], AIMessage)
    assert (result["parsed"] is None) == (result["parsing_error"] is not None)
