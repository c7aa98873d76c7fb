"""Fixtures of the server tests: one tiny chat model (and MiniLM embeddings) served by a real
uvicorn server for the whole session, and the official clients pointed at it."""

from __future__ import annotations

import pytest
from serve_helpers import serving

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.embeddings import AscendEmbeddings
from langchain_ascend.serve import create_app
from langchain_ascend.testing import minilm_path

MODEL = "tiny"
EMBEDDINGS = "minilm"


@pytest.fixture(scope="session")
def served_chat(tiny_qwen2_path) -> AscendChatModel:
    """Greedy, short replies; the one engine every served request runs on."""
    model = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=0,
                            max_tokens=16, max_context_length=1024)
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def served_embeddings() -> AscendEmbeddings:
    return AscendEmbeddings(model=str(minilm_path()), device="cpu")


@pytest.fixture(scope="session")
def server_app(served_chat, served_embeddings):
    return create_app(served_chat, embeddings=served_embeddings, served_model_name=MODEL,
                      embeddings_model_name=EMBEDDINGS, max_body_bytes=1024 * 1024)


@pytest.fixture(scope="session")
def base_url(server_app) -> str:
    with serving(server_app) as url:
        yield url


@pytest.fixture(scope="session")
def client(base_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def async_client(base_url):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                       timeout=120)


@pytest.fixture(scope="session")
def engine(served_chat):
    return served_chat.get_engine()
