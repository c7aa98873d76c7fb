"""langchain-tests' VectorStoreIntegrationTests (sync and async) on every index type."""

from __future__ import annotations

from collections.abc import Generator

import pytest
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_ascend import AscendFAISS


class TestFlatStandard(VectorStoreIntegrationTests):
    """The default exact device index."""

    @pytest.fixture
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        yield AscendFAISS(embedding=self.get_embeddings(), device="cpu")


class TestCosineHalfStandard(VectorStoreIntegrationTests):
    """Real cosine on a float16 device index."""

    @pytest.fixture
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        yield AscendFAISS(embedding=self.get_embeddings(), device="cpu", dtype="float16",
                          distance_strategy="COSINE")


class TestIVFStandard(VectorStoreIntegrationTests):
    """IVF trained from the first search on (one list, so results stay exact)."""

    @pytest.fixture
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        yield AscendFAISS(embedding=self.get_embeddings(), device="cpu", index_type="ivf",
                          nlist=1, ivf_min_train_size=1)


class TestFaissStandard(VectorStoreIntegrationTests):
    """faiss-cpu backend (IDMap2 over a flat index)."""

    @pytest.fixture
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        yield AscendFAISS(embedding=self.get_embeddings(), device="cpu", index_type="faiss",
                          faiss_factory="Flat")
