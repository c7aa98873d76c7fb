"""AscendEmbeddings on MiniLM (CPU, offline): standard suites, parity with
HuggingFaceEmbeddings, batching, prompts, progress, async, errors, store integration."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest
import torch
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from langchain_ascend import AscendEmbeddings, AscendFAISS
from langchain_ascend.embeddings import default_model, plan_batches
from langchain_ascend.errors import EmbeddingModelError, VectorStoreInputError
from langchain_ascend.testing import minilm_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MINILM = str(minilm_path())
MIXED = [
    "short",
    "The weather in Paris is sunny with a light breeze in the afternoon. " * 6,
    "北京今天天气晴朗，气温二十五度，适合户外活动。我们下午去公园散步吧。",
    'def add(a: int, b: int) -> int:\n    return a + b  # {"json": [1, 2, 3]}',
    "",
    "short",
    "Agents call retrieval on every hop; " * 40,  # longer than the 256-token limit
]


@pytest.fixture(scope="module")
def emb() -> AscendEmbeddings:
    return AscendEmbeddings(model=MINILM, device="cpu")


class TestAscendEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[AscendEmbeddings]:
        return AscendEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": MINILM, "device": "cpu"}


class TestAscendEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[AscendEmbeddings]:
        return AscendEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": MINILM, "device": "cpu"}


def test_default_model_is_the_shipped_minilm() -> None:
    assert default_model() == MINILM
    assert AscendEmbeddings(device="cpu").dimension == 384


def test_same_vectors_as_huggingface_embeddings(emb) -> None:
    from langchain_huggingface import HuggingFaceEmbeddings

    hf = HuggingFaceEmbeddings(model_name=MINILM, model_kwargs={"device": "cpu"})
    ours = np.array(emb.embed_documents(MIXED))
    theirs = np.array(hf.embed_documents(MIXED))
    assert ours.shape == (len(MIXED), 384)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(emb.embed_query(MIXED[2]), hf.embed_query(MIXED[2]), atol=1e-5)


def test_batches_are_length_sorted_token_budgets() -> None:
    lengths = [5, 300, 40, 41, 7, 300, 6]
    batches = plan_batches(lengths, batch_size=3, max_batch_tokens=120)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert batches == [[1], [5], [3, 2], [4, 6, 0]]
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 120
    with pytest.raises(ValueError):
        plan_batches([1], 0, 10)


def test_batching_and_duplicates_do_not_change_vectors(emb) -> None:
    tight = AscendEmbeddings(model=MINILM, device="cpu", batch_size=2, max_batch_tokens=64)
    reference = emb.embed_documents_tensor(MIXED)
    np.testing.assert_allclose(tight.embed_documents_tensor(MIXED).numpy(), reference.numpy(),
                               atol=1e-5)
    assert torch.equal(reference[0], reference[5])  # "short" twice: embedded once


def test_tensor_methods_stay_on_device_and_normalize(emb) -> None:
    vectors = emb.embed_documents_tensor(["a cat", "a dog"])
    assert isinstance(vectors, torch.Tensor) and vectors.device == emb.torch_device
    assert vectors.dtype == torch.float32
    np.testing.assert_allclose(vectors.norm(dim=1).numpy(), [1.0, 1.0], atol=1e-5)
    assert emb.embed_queries_tensor([]).shape == (0, 384)
    assert emb.embed_documents([]) == []


def test_query_and_document_prompts() -> None:
    prompted = AscendEmbeddings(model=MINILM, device="cpu",
                                model_kwargs={"prompts": {"query": "query: ",
                                                          "document": "passage: "}})
    plain = AscendEmbeddings(model=MINILM, device="cpu")
    np.testing.assert_allclose(prompted.embed_query("cats"),
                               plain.embed_documents(["query: cats"])[0], atol=1e-5)
    np.testing.assert_allclose(prompted.embed_documents(["cats"])[0],
                               plain.embed_documents(["passage: cats"])[0], atol=1e-5)
    override = AscendEmbeddings(model=MINILM, device="cpu", query_prompt="search: ")
    np.testing.assert_allclose(override.embed_query("cats"),
                               plain.embed_documents(["search: cats"])[0], atol=1e-5)


def test_progress_bar_for_multi_batch_inputs(capsys) -> None:
    noisy = AscendEmbeddings(model=MINILM, device="cpu", batch_size=2, show_progress=True)
    noisy.embed_documents([f"text number {i}" for i in range(6)])
    assert "Embedding" in capsys.readouterr().err
    noisy.embed_documents(["one"])  # a single batch shows no bar
    assert "Embedding" not in capsys.readouterr().err


def test_async_does_not_block_the_event_loop(emb) -> None:
    texts = [f"sentence {i} " * 30 for i in range(48)]

    async def run() -> tuple[list[list[float]], int]:
        ticks = 0
        task = asyncio.ensure_future(emb.aembed_documents(texts))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.001)
        return await task, ticks

    started = time.perf_counter()
    vectors, ticks = asyncio.run(run())
    assert len(vectors) == 48 and ticks > 3, (ticks, time.perf_counter() - started)


def test_bad_input_errors() -> None:
    with pytest.raises(EmbeddingModelError, match="cannot load embedding model"):
        AscendEmbeddings(model="/no/such/model/folder", device="cpu")
    emb = AscendEmbeddings(model=MINILM, device="cpu")
    with pytest.raises(VectorStoreInputError, match="item 1 is int"):
        emb.embed_documents(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        AscendEmbeddings(model=MINILM, device="cpu", batch_size=0)


def test_store_uses_the_tensor_path(emb, monkeypatch) -> None:
    def no_lists(*args, **kwargs):
        raise AssertionError("the store must not ask for Python lists")

    monkeypatch.setattr(AscendEmbeddings, "embed_documents", no_lists)
    monkeypatch.setattr(AscendEmbeddings, "embed_query", no_lists)
    texts = ["The cat sat on the mat.", "Stock markets fell sharply.", "A kitten is napping."]
    store = AscendFAISS.from_texts(texts, emb, device="cpu", distance_strategy="COSINE")
    hits = store.similarity_search_with_relevance_scores("a sleeping cat", k=2)
    assert {d.page_content for d, _ in hits} == {texts[0], texts[2]}
    assert all(0.0 < s <= 1.0 for _, s in hits)
    batched = store.as_retriever(search_kwargs={"k": 1}).batch(["kitten", "stocks"])
    assert [docs[0].page_content for docs in batched] == [texts[2], texts[1]]


def test_huggingface_style_arguments() -> None:
    emb = AscendEmbeddings(model_name=MINILM, model_kwargs={"device": "cpu"})
    assert emb.model == MINILM and emb.torch_device.type == "cpu"
    assert len(emb.embed_query("migration is a rename")) == 384
