"""The demo's setup does only the work its run needs: the bundled documents embedded in one
call (each call has a fixed cost), and the grammars of its agent's hops, read from the hop
bindings (hop 1's forced call under parallel_tool_calls=False, hop 2's "none")."""

from __future__ import annotations

from types import SimpleNamespace

from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import RunnableLambda

from langchain_ascend.app.demo import build_index, load_documents
from langchain_ascend.app.demo_warm_up import hop_calls


class CountingEmbedding(DeterministicFakeEmbedding):
    calls: list[int] = []

    def embed_documents(self, texts):
        self.calls.append(len(texts))
        return super().embed_documents(texts)


def test_the_bundled_documents_are_embedded_in_one_call():
    docs = load_documents()
    embeddings = CountingEmbedding(size=8)
    store = build_index(embeddings, docs, progress=False)
    assert embeddings.calls == [len(docs)]
    found = store.similarity_search(docs[3]["text"], k=1)
    assert found[0].metadata["topic"] == docs[3]["topic"]


def test_hop_calls_are_the_bindings_arguments():
    echo = RunnableLambda(lambda x: x)
    forced = echo.bind(tools=[{"name": "t"}], tool_choice="required", parallel_tool_calls=False)
    free = echo.bind(tools=[{"name": "t"}], tool_choice="none")
    agent = SimpleNamespace(models=[forced, free, echo])  # a bare model binds nothing
    assert hop_calls(agent) == [
        {"tools": [{"name": "t"}], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [{"name": "t"}], "tool_choice": "none"},
    ]
