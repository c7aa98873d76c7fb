"""HuggingFaceEmbeddings' ``encode_kwargs`` / ``query_encode_kwargs`` / ``cache_folder`` on
AscendEmbeddings (MiniLM, CPU, offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from langchain_ascend import AscendEmbeddings  # noqa: E402
from langchain_ascend.errors import (  # noqa: E402
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)
from langchain_ascend.testing import minilm_path  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MINILM = str(minilm_path())
TEXTS = ["The weather in Paris is sunny.", "Agents call tools.", "short"]


@pytest.fixture(scope="module")
def plain() -> AscendEmbeddings:
    return AscendEmbeddings(model=MINILM, device="cpu")


def spy_encoders(emb: AscendEmbeddings, monkeypatch) -> list[tuple[str, int, dict]]:
    """Record (kind, number of texts, keyword arguments) of every encoder call."""
    calls: list[tuple[str, int, dict]] = []
    for kind in ("encode_document", "encode_query"):
        original = getattr(emb.client, kind)

        def spy(texts, *args, _kind=kind, _original=original, **kwargs):
            calls.append((_kind, len(texts), kwargs))
            return _original(texts, *args, **kwargs)

        monkeypatch.setattr(emb.client, kind, spy)
    return calls


def test_encode_kwargs_set_normalization_and_batch_size(plain, monkeypatch):
    # MiniLM ends in a Normalize module, so its vectors are unit length either way: what is
    # checked is what reaches the encoder
    raw = AscendEmbeddings(model=MINILM, device="cpu",
                           encode_kwargs={"normalize_embeddings": False, "batch_size": 1})
    calls = spy_encoders(raw, monkeypatch)
    vectors = raw.embed_documents(TEXTS)
    assert [(kind, n) for kind, n, _ in calls] == [("encode_document", 1)] * 3
    assert all(kwargs["normalize_embeddings"] is False for _, _, kwargs in calls)
    assert torch.allclose(torch.tensor(vectors), torch.tensor(plain.embed_documents(TEXTS)),
                          atol=1e-5)
    calls.clear()
    raw.embed_query(TEXTS[0])  # queries follow encode_kwargs unless query_encode_kwargs is given
    assert calls[0][0] == "encode_query" and calls[0][2]["normalize_embeddings"] is False
    both = AscendEmbeddings(model=MINILM, device="cpu",
                            encode_kwargs={"normalize_embeddings": False},
                            query_encode_kwargs={"normalize_embeddings": True})
    calls.clear()
    both.embed_query(TEXTS[0])
    assert calls[0][2]["normalize_embeddings"] is True


def test_prompt_and_truncate_dim_reach_the_encoder(plain):
    prompted = AscendEmbeddings(model=MINILM, device="cpu",
                                query_encode_kwargs={"prompt": "query: "})
    assert torch.allclose(torch.tensor(prompted.embed_query("cats")),
                          torch.tensor(plain.embed_documents(["query: cats"])[0]), atol=1e-5)
    short = AscendEmbeddings(model=MINILM, device="cpu", encode_kwargs={"truncate_dim": 16,
                                                                        "convert_to_numpy": True})
    assert len(short.embed_documents(["cats"])[0]) == 16


def test_cache_folder_is_passed_to_sentence_transformers(tmp_path, monkeypatch):
    import sentence_transformers

    seen = {}
    original = sentence_transformers.SentenceTransformer

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", spy)
    emb = AscendEmbeddings(model=MINILM, device="cpu", cache_folder=str(tmp_path))
    assert seen["cache_folder"] == str(tmp_path)
    assert len(emb.embed_query("x")) == emb.dimension


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"encode_kwargs": {"precision": "int8"}}, "keys \\['precision'\\] are not supported"),
    ({"encode_kwargs": {"batch_size": 0}}, "batch_size"),
    ({"encode_kwargs": {"normalize_embeddings": 1}}, "normalize_embeddings"),
    ({"query_encode_kwargs": "fast"}, "query_encode_kwargs must be a dict"),
])
def test_bad_encode_kwargs_name_the_key(kwargs, match):
    # construction errors are pydantic ValidationErrors carrying the message, as for the
    # other fields
    with pytest.raises(ValueError, match=match):
        AscendEmbeddings(model=MINILM, device="cpu", **kwargs)


def test_a_pathlib_path_names_the_model():
    assert AscendEmbeddings(model=Path(MINILM), device="cpu").model == str(MINILM)


def test_encode_kwargs_check_raises_typed_errors():
    from langchain_ascend.embeddings import check_encode_kwargs

    with pytest.raises(VectorStoreInputError, match="precision"):
        check_encode_kwargs("encode_kwargs", {"precision": "int8"})
    with pytest.raises(VectorStoreArgumentTypeError, match="must be a dict"):
        check_encode_kwargs("encode_kwargs", ["batch_size"])
