"""Per-request ``tools`` / ``response_format`` through the server: each new schema compiles once,
a repeated one compiles nothing; ``/v1/models`` names the embeddings model by a recognisable id.
Through the app's test client (no uvicorn)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from langchain_ascend.embeddings import AscendEmbeddings, default_model
from langchain_ascend.serve import create_app
from langchain_ascend.serve.app import default_embeddings_name
from langchain_ascend.structured.selection import grammar_backend

MODEL = "tiny"


def tool(i: int) -> dict:
    return {"type": "function", "function": {
        "name": f"book_room_{i}", "description": "Book a room.",
        "parameters": {"type": "object", "properties": {
            f"hotel_{i}": {"type": "string"},
            "nights": {"type": "integer"},
            "view": {"type": "string", "enum": ["sea", "city"]}},
            "required": [f"hotel_{i}", "nights"]}}}


@pytest.fixture(scope="module")
def http(served_chat):
    return TestClient(create_app(served_chat, served_model_name=MODEL))


def forced_call(http, i: int) -> dict:
    body = {"model": MODEL, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Book me a room"}],
            "tools": [tool(i)],
            "tool_choice": {"type": "function", "function": {"name": f"book_room_{i}"}}}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


def test_each_new_tool_compiles_once_and_a_repeated_one_not_at_all(http, served_chat):
    backend = grammar_backend(served_chat.get_engine())
    for i in (3601, 3602):
        before = backend.num_compiles
        message = forced_call(http, i)
        assert backend.num_compiles == before + 1
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == f"book_room_{i}"
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            tool(i)["function"]["parameters"])
        forced_call(http, i)  # the same tool set again
        assert backend.num_compiles == before + 1


def test_each_new_response_format_compiles_once(http, served_chat):
    backend = grammar_backend(served_chat.get_engine())
    schema = {"type": "object", "properties": {"answer_3603": {"type": "integer"}},
              "required": ["answer_3603"]}
    body = {"model": MODEL, "max_tokens": 32,
            "messages": [{"role": "user", "content": "A number?"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": schema}}}
    before = backend.num_compiles
    for _ in range(2):
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert backend.num_compiles == before + 1


def test_models_names_the_default_embeddings_all_minilm(served_chat):
    app = create_app(served_chat, embeddings=AscendEmbeddings(device="cpu"),
                     served_model_name=MODEL)
    ids = [m["id"] for m in TestClient(app).get("/v1/models").json()["data"]]
    assert ids == [MODEL, "all-MiniLM-L6-v2"]


def test_one_model_by_id_head_health_and_a_wrong_method(served_chat, base_url):
    """What OpenAI's SDK and health checkers call: ``models.retrieve``, ``HEAD /health``; a
    method a route does not take is the client's error (``invalid_request_error``)."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(NotFoundError):
        client.models.retrieve("no-such-model")
    http = TestClient(create_app(served_chat, served_model_name=MODEL))
    assert http.head("/health").status_code == 200
    hub_named = TestClient(create_app(served_chat, served_model_name="org/some-model"))
    assert hub_named.get("/v1/models/org/some-model").json()["id"] == "org/some-model"
    wrong = http.put("/v1/chat/completions", json={})
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def test_default_embeddings_names(tmp_path):
    assert default_embeddings_name(default_model()) == "all-MiniLM-L6-v2"
    assert default_embeddings_name("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    folder = tmp_path / "my-embedder"
    folder.mkdir()
    assert default_embeddings_name(str(folder)) == "my-embedder"
