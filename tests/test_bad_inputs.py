"""The bad-input matrix: every bad input to the four components (chat model, embeddings,
vector store, tool executor) raises a typed error — a ``LangChainAscendError`` that is also
the builtin a caller expects — whose message names the argument or value, and the component
serves a normal call right after.

One shared chat model, one embedding model and one store keep the file fast. Construction
errors of the pydantic components (chat model, embeddings' fields) are pydantic
``ValidationError``\\ s naming the field, as LangChain does; their cause is still checked to be
our typed error.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from pydantic import ValidationError

from langchain_ascend import AscendEmbeddings, AscendFAISS, NPUStreamToolExecutor
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.errors import (
    InvalidArgumentTypeError,
    InvalidFilterError,
    InvalidRequestError,
    InvalidTextError,
    LangChainAscendError,
    ToolCallError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)
from langchain_ascend.testing import minilm_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@dataclass
class Ctx:
    chat: AscendChatModel
    chat_path: str
    emb: AscendEmbeddings
    store: AscendFAISS
    executor: NPUStreamToolExecutor


@pytest.fixture(scope="module")
def ctx(tiny_qwen2_path) -> Ctx:  # type: ignore[no-untyped-def]
    chat = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0,
                           max_tokens=2)
    emb = AscendEmbeddings(model=str(minilm_path()), device="cpu")
    store = AscendFAISS.from_texts(["alpha", "beta", "gamma", "delta"],
                                   DeterministicFakeEmbedding(size=16),
                                   metadatas=[{"n": i} for i in range(4)],
                                   ids=["a", "b", "c", "d"], device="cpu")
    executor = NPUStreamToolExecutor([add], timeout_ms=5000, device="cpu")
    return Ctx(chat, str(tiny_qwen2_path), emb, store, executor)


def _call(a: int = 1, b: int = 2) -> dict[str, Any]:
    return {"name": "add", "args": {"a": a, "b": b}, "id": "c1", "type": "tool_call"}


def _normal(component: str, c: Ctx) -> None:
    """A normal call of ``component`` succeeds after a bad one."""
    if component == "chat":
        assert c.chat.invoke("hello", max_tokens=1).usage_metadata["output_tokens"] == 1
    elif component == "embeddings":
        assert len(c.emb.embed_query("hello")) == c.emb.dimension
    elif component == "store":
        assert len(c.store.similarity_search("alpha", k=2)) == 2
    else:
        (message,) = c.executor.invoke([_call()])
        assert message.content == "3"


Case = tuple[str, str, Callable[[Ctx], Any], tuple[type[BaseException], ...], tuple[str, ...]]

_NAN, _INF = math.nan, math.inf
_SUR = "ok \ud800 text"

CHAT: list[Case] = [
    ("chat", "max_tokens=True", lambda c: c.chat.invoke("hi", max_tokens=True),
     (InvalidArgumentTypeError, TypeError, ValueError), ("max_tokens", "True")),
    ("chat", "max_tokens=0", lambda c: c.chat.invoke("hi", max_tokens=0),
     (InvalidRequestError, ValueError), ("max_tokens", "0")),
    ("chat", "max_tokens='3'", lambda c: c.chat.invoke("hi", max_tokens="3"),
     (InvalidArgumentTypeError, TypeError), ("max_tokens", "'3'")),
    ("chat", "top_k=2.7", lambda c: c.chat.invoke("hi", top_k=2.7),
     (InvalidArgumentTypeError, TypeError), ("top_k", "2.7")),
    ("chat", "top_k=-1", lambda c: c.chat.invoke("hi", top_k=-1),
     (InvalidRequestError, ValueError), ("top_k", "-1")),
    ("chat", "temperature=inf", lambda c: c.chat.invoke("hi", temperature=_INF),
     (InvalidRequestError, ValueError), ("temperature", "inf")),
    ("chat", "temperature=nan", lambda c: c.chat.invoke("hi", temperature=_NAN),
     (InvalidRequestError, ValueError), ("temperature", "nan")),
    ("chat", "temperature=-1", lambda c: c.chat.invoke("hi", temperature=-1),
     (InvalidRequestError, ValueError), ("temperature", "-1")),
    ("chat", "temperature='hot'", lambda c: c.chat.invoke("hi", temperature="hot"),
     (InvalidArgumentTypeError, TypeError), ("temperature", "'hot'")),
    ("chat", "top_p=0", lambda c: c.chat.invoke("hi", top_p=0),
     (InvalidRequestError, ValueError), ("top_p", "0")),
    ("chat", "top_p=nan", lambda c: c.chat.invoke("hi", top_p=_NAN),
     (InvalidRequestError, ValueError), ("top_p", "nan")),
    ("chat", "seed='x'", lambda c: c.chat.invoke("hi", seed="x", temperature=0.5),
     (InvalidArgumentTypeError, TypeError), ("seed", "'x'")),
    ("chat", "seed=2**70", lambda c: c.chat.invoke("hi", seed=2**70, temperature=0.5),
     (InvalidRequestError, ValueError), ("seed", str(2**70))),
    ("chat", "seed=1.5", lambda c: c.chat.invoke("hi", seed=1.5, temperature=0.5),
     (InvalidArgumentTypeError, TypeError), ("seed", "1.5")),
    ("chat", "stop=[1]", lambda c: c.chat.invoke("hi", stop=[1]),
     (InvalidArgumentTypeError, TypeError), ("stop[0]", "1")),
    ("chat", "stop=['']", lambda c: c.chat.invoke("hi", stop=[""]),
     (InvalidArgumentTypeError, ValueError), ("stop[0]", "''")),
    ("chat", "empty prompt", lambda c: c.chat.invoke(""),
     (InvalidRequestError, ValueError), ("prompt is empty",)),
    ("chat", "whitespace prompt", lambda c: c.chat.invoke("   "),
     (InvalidRequestError, ValueError), ("prompt is empty", "'   '")),
    ("chat", "one empty human message", lambda c: c.chat.invoke([HumanMessage("")]),
     (InvalidRequestError, ValueError), ("prompt is empty",)),
    ("chat", "blank system + human", lambda c: c.chat.invoke([SystemMessage(" "),
                                                             HumanMessage("\n")]),
     (InvalidRequestError, ValueError), ("prompt is empty",)),
    ("chat", "no messages", lambda c: c.chat.invoke([]),
     (InvalidRequestError, ValueError), ("messages is empty",)),
    ("chat", "lone surrogate invoke", lambda c: c.chat.invoke(_SUR),
     (InvalidTextError, ValueError), ("messages[0].content", "position 3", "\\ud800")),
    ("chat", "lone surrogate stream", lambda c: list(c.chat.stream(_SUR)),
     (InvalidTextError, ValueError), ("messages[0].content", "position 3")),
    ("chat", "lone surrogate ainvoke", lambda c: asyncio.run(c.chat.ainvoke(_SUR)),
     (InvalidTextError, ValueError), ("messages[0].content", "position 3")),
    ("chat", "unknown call kwarg", lambda c: c.chat.invoke("hi", temprature=1),
     (InvalidRequestError, ValueError), ("temprature",)),
    ("chat", "tool dict without name",
     lambda c: c.chat.bind_tools([{"type": "function", "function": {"parameters": {}}}]),
     (InvalidRequestError, ValueError), ("tools[0]", "name")),
    ("chat", "unconvertible tool dict", lambda c: c.chat.bind_tools([{"foo": 1}]),
     (InvalidRequestError, ValueError), ("tools[0]", "'foo'")),
    ("chat", "tools as a str", lambda c: c.chat.bind_tools("add"),
     (InvalidArgumentTypeError, TypeError), ("tools", "'add'")),
    ("chat", "tools=[str]", lambda c: c.chat.bind_tools(["add"]),
     (InvalidArgumentTypeError, TypeError), ("tools[0]", "'add'")),
    ("chat", "tool_choice names no tool", lambda c: c.chat.bind_tools([add],
                                                                      tool_choice="nope"),
     (InvalidRequestError, ValueError), ("tool_choice", "'nope'")),
    ("chat", "tool_choice without tools", lambda c: c.chat.invoke("hi",
                                                                  tool_choice="required"),
     (InvalidRequestError, ValueError), ("tool_choice", "no tools")),
    ("chat", "structured method", lambda c: c.chat.with_structured_output(
        {"title": "x", "type": "object"}, method="xml"),
     (InvalidRequestError, ValueError), ("method", "'xml'")),
    ("chat", "ignore_eos='yes'", lambda c: c.chat.invoke("hi", ignore_eos="yes"),
     (InvalidArgumentTypeError, TypeError), ("ignore_eos", "'yes'")),
]

# Construction: pydantic ValidationError naming the field, caused by our typed error.
CONSTRUCT: list[tuple[str, dict[str, Any], str]] = [
    ("dtype=float8", {"dtype": "float8"}, "float8"),
    ("device=cpu:1", {"device": "cpu:1"}, "cpu:1"),
    ("device=tpu", {"device": "tpu"}, "tpu"),
    ("max_tokens=True", {"max_tokens": True}, "max_tokens"),
    ("max_new_tokens=True", {"max_new_tokens": True}, "max_tokens"),
    ("top_k=2.7", {"top_k": 2.7}, "top_k"),
    ("temperature=inf", {"temperature": _INF}, "temperature"),
    ("temperature=nan", {"temperature": _NAN}, "temperature"),
    ("seed=2**64", {"seed": 2**64}, "seed"),
    ("seed=True", {"seed": True}, "seed"),
    ("max_batch_size=True", {"max_batch_size": True}, "max_batch_size"),
    ("num_kv_blocks=True", {"num_kv_blocks": True}, "num_kv_blocks"),
    ("block_size=True", {"block_size": True}, "block_size"),
    ("max_context_length=True", {"max_context_length": True}, "max_context_length"),
    ("max_num_batched_tokens=True", {"max_num_batched_tokens": True}, "max_num_batched_tokens"),
    ("num_speculative_tokens=True", {"num_speculative_tokens": True}, "num_speculative_tokens"),
    ("top_k=True", {"top_k": True}, "top_k"),
    ("kv_cache_memory_fraction=True", {"kv_cache_memory_fraction": True},
     "kv_cache_memory_fraction"),
    ("enable_prefix_caching='yes'", {"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
    ("chat_template=3", {"chat_template": 3}, "chat_template"),
    ("num_kv_blocks=0", {"num_kv_blocks": 0}, "num_kv_blocks"),
    ("kv_cache_memory_fraction=nan", {"kv_cache_memory_fraction": _NAN},
     "kv_cache_memory_fraction"),
    ("stop=[3]", {"stop": [3]}, "stop[0]"),
]

EMBEDDINGS: list[Case] = [
    ("embeddings", "embed_documents(str)", lambda c: c.emb.embed_documents("one text"),
     (VectorStoreArgumentTypeError, TypeError, ValueError), ("texts", "'one text'",
                                                            "embed_query")),
    ("embeddings", "embed_documents(None)", lambda c: c.emb.embed_documents(None),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "None")),
    ("embeddings", "embed_documents([1])", lambda c: c.emb.embed_documents(["a", 1]),
     (VectorStoreArgumentTypeError, TypeError), ("item 1", "int")),
    ("embeddings", "embed_documents(surrogate)", lambda c: c.emb.embed_documents(["a", _SUR]),
     (InvalidTextError, ValueError), ("texts[1]", "position 3")),
    ("embeddings", "embed_query(surrogate)", lambda c: c.emb.embed_query(_SUR),
     (InvalidTextError, ValueError), ("texts[0]", "position 3")),
    ("embeddings", "embed_query(list)", lambda c: c.emb.embed_query(["a"]),
     (VectorStoreArgumentTypeError, TypeError), ("embed_query", "list")),
    ("embeddings", "aembed_documents(str)",
     lambda c: asyncio.run(c.emb.aembed_documents("one text")),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "'one text'")),
    ("embeddings", "embed_documents_tensor(dict)",
     lambda c: c.emb.embed_documents_tensor({"a": 1}),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "dict")),
    ("embeddings", "dtype=float8", lambda c: AscendEmbeddings(model=str(minilm_path()),
                                                             device="cpu", dtype="float8"),
     (InvalidRequestError, ValueError), ("dtype", "float8")),
    ("embeddings", "device=cpu:1", lambda c: AscendEmbeddings(model=str(minilm_path()),
                                                             device="cpu:1"),
     (InvalidRequestError, ValueError), ("device", "cpu:1")),
]

STORE: list[Case] = [
    ("store", "k='3'", lambda c: c.store.similarity_search("x", k="3"),
     (VectorStoreArgumentTypeError, TypeError, ValueError), ("k", "'3'")),
    ("store", "k=None", lambda c: c.store.similarity_search("x", k=None),
     (VectorStoreArgumentTypeError, TypeError), ("k", "None")),
    ("store", "k=True", lambda c: c.store.similarity_search("x", k=True),
     (VectorStoreArgumentTypeError, TypeError), ("k", "True")),
    ("store", "k=-1", lambda c: c.store.similarity_search("x", k=-1),
     (VectorStoreInputError, ValueError), ("k", "-1")),
    ("store", "mmr k=-1", lambda c: c.store.max_marginal_relevance_search("x", k=-1),
     (VectorStoreInputError, ValueError), ("k", "-1")),
    ("store", "mmr fetch_k=0", lambda c: c.store.max_marginal_relevance_search("x", fetch_k=0),
     (VectorStoreInputError, ValueError), ("fetch_k", "0")),
    ("store", "mmr lambda_mult=5",
     lambda c: c.store.max_marginal_relevance_search("x", lambda_mult=5),
     (VectorStoreInputError, ValueError), ("lambda_mult", "5")),
    ("store", "mmr lambda_mult=nan",
     lambda c: c.store.max_marginal_relevance_search("x", lambda_mult=_NAN),
     (VectorStoreInputError, ValueError), ("lambda_mult", "nan")),
    ("store", "add_texts(None)", lambda c: c.store.add_texts(None),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "None")),
    ("store", "add_texts(str)", lambda c: c.store.add_texts("hello"),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "'hello'")),
    ("store", "add_texts([1])", lambda c: c.store.add_texts(["ok", 1]),
     (VectorStoreArgumentTypeError, TypeError), ("texts[1]", "int")),
    ("store", "metadatas=dict", lambda c: c.store.add_texts(["x"], metadatas={"n": 1}),
     (VectorStoreArgumentTypeError, TypeError), ("metadatas", "dict")),
    ("store", "metadatas length", lambda c: c.store.add_texts(["x", "y"], metadatas=[{}]),
     (VectorStoreInputError, ValueError), ("metadatas", "len(metadatas)=1")),
    ("store", "ids length", lambda c: c.store.add_texts(["x", "y"], ids="only-one"),
     (VectorStoreInputError, ValueError), ("ids", "len(ids)=1")),
    ("store", "duplicate ids", lambda c: c.store.add_texts(["x", "y"], ids=["z", "z"]),
     (VectorStoreInputError, ValueError), ("Duplicate ids", "z")),
    ("store", "from_texts(str)", lambda c: AscendFAISS.from_texts(
        "abc", DeterministicFakeEmbedding(size=4), device="cpu"),
     (VectorStoreArgumentTypeError, TypeError), ("texts", "'abc'")),
    ("store", "delete(None)", lambda c: c.store.delete(None),
     (VectorStoreInputError, ValueError), ("ids=None",)),
    ("store", "delete(5.5)", lambda c: c.store.delete(5.5),
     (VectorStoreArgumentTypeError, TypeError), ("ids", "5.5")),
    ("store", "get_by_ids([None])", lambda c: c.store.get_by_ids([None]),
     (VectorStoreArgumentTypeError, TypeError), ("ids[0]", "None")),
    ("store", "batch queries str", lambda c: c.store.similarity_search_batch("abc"),
     (VectorStoreArgumentTypeError, TypeError), ("queries", "'abc'")),
    ("store", "mmr batch queries str",
     lambda c: c.store.max_marginal_relevance_search_batch("abc"),
     (VectorStoreArgumentTypeError, TypeError), ("queries", "'abc'")),
    ("store", "filter $in str", lambda c: c.store.similarity_search(
        "x", filter={"n": {"$in": "abc"}}),
     (InvalidFilterError, ValueError), ("$in", "'abc'")),
    ("store", "filter $nin int", lambda c: c.store.similarity_search(
        "x", filter={"n": {"$nin": 3}}),
     (InvalidFilterError, ValueError), ("$nin", "3")),
    ("store", "filter $bogus", lambda c: c.store.similarity_search(
        "x", filter={"n": {"$bogus": 3}}),
     (InvalidFilterError, ValueError), ("$bogus",)),
    ("store", "filter $and str", lambda c: c.store.similarity_search(
        "x", filter={"$and": "n"}),
     (InvalidFilterError, ValueError), ("$and", "'n'")),
    ("store", "ivf nprobe=0", lambda c: AscendFAISS(
        embedding=DeterministicFakeEmbedding(size=4), index_type="ivf", nprobe=0, device="cpu"),
     (VectorStoreInputError, ValueError), ("nprobe", "0")),
    ("store", "ivf nlist='8'", lambda c: AscendFAISS(
        embedding=DeterministicFakeEmbedding(size=4), index_type="ivf", nlist="8",
        device="cpu"),
     (VectorStoreArgumentTypeError, TypeError), ("nlist", "'8'")),
    ("store", "index_type", lambda c: AscendFAISS(
        embedding=DeterministicFakeEmbedding(size=4), index_type="hnsw", device="cpu"),
     (VectorStoreInputError, ValueError), ("index_type", "'hnsw'")),
    ("store", "dtype=float8", lambda c: AscendFAISS(
        embedding=DeterministicFakeEmbedding(size=4), dtype="float8", device="cpu"),
     (VectorStoreInputError, ValueError), ("dtype", "'float8'")),
    ("store", "device=cpu:1", lambda c: AscendFAISS(
        embedding=DeterministicFakeEmbedding(size=4), device="cpu:1"),
     (VectorStoreInputError, ValueError), ("device", "'cpu:1'")),
    ("store", "vector width", lambda c: c.store.similarity_search_by_vector([0.0] * 3),
     (VectorStoreInputError, ValueError), ("3", "16")),
    ("store", "vector nan", lambda c: c.store.similarity_search_by_vector([_NAN] * 16),
     (VectorStoreInputError, ValueError), ("NaN",)),
]

EXECUTOR: list[Case] = [
    ("executor", "tools as a str", lambda c: NPUStreamToolExecutor("add"),
     (InvalidArgumentTypeError, TypeError, ValueError), ("tools", "'add'")),
    ("executor", "tools=[3]", lambda c: NPUStreamToolExecutor([3]),
     (InvalidArgumentTypeError, TypeError), ("tools[0]", "3")),
    ("executor", "timeout_ms=0", lambda c: NPUStreamToolExecutor([add], timeout_ms=0),
     (InvalidRequestError, ValueError), ("timeout_ms", "0")),
    ("executor", "retry_times=True", lambda c: NPUStreamToolExecutor([add], retry_times=True),
     (InvalidRequestError, ValueError), ("retry_times", "True")),
    ("executor", "max_concurrency=0", lambda c: NPUStreamToolExecutor([add],
                                                                     max_concurrency=0),
     (InvalidRequestError, ValueError), ("max_concurrency", "0")),
    ("executor", "max_abandoned_threads=0",
     lambda c: NPUStreamToolExecutor([add], max_abandoned_threads=0),
     (InvalidRequestError, ValueError), ("max_abandoned_threads", "0")),
    ("executor", "enable_parallel='no'",
     lambda c: NPUStreamToolExecutor([add], enable_parallel="no"),
     (InvalidArgumentTypeError, TypeError), ("enable_parallel", "'no'")),
    ("executor", "duplicate tool names", lambda c: NPUStreamToolExecutor([add, add]),
     (InvalidRequestError, ValueError), ("'add'",)),
    ("executor", "input str", lambda c: c.executor.invoke("add 1 2"),
     (ToolCallError, ValueError), ("str",)),
    ("executor", "input int", lambda c: c.executor.invoke(42),
     (ToolCallError, ValueError), ("int",)),
    ("executor", "state messages str", lambda c: c.executor.invoke({"messages": "hi"}),
     (ToolCallError, ValueError), ("messages", "'hi'")),
    ("executor", "state without messages", lambda c: c.executor.invoke({"msgs": []}),
     (ToolCallError, ValueError), ("'messages'", "msgs")),
]

# ---- True is never a count: one case per count each component takes -----------------------
_TYPE = (InvalidArgumentTypeError, TypeError, ValueError)
_STORE_TYPE = (VectorStoreArgumentTypeError, TypeError, ValueError)


def _engine(c: Ctx, **settings: Any) -> Any:
    from langchain_ascend.engine.shared_engines import get_engine

    return get_engine(c.chat_path, device="cpu", **settings)


def _generate(c: Ctx, **params: Any) -> Any:
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    engine = c.chat._engine_for()
    return engine.generate(engine.tokenizer.encode("hi"), SamplingParams(**params))


def _ivf(**options: Any) -> AscendFAISS:
    return AscendFAISS(embedding=DeterministicFakeEmbedding(size=4), index_type="ivf",
                       device="cpu", **options)


TRUE_COUNTS: list[Case] = [
    ("chat", "num_speculative_tokens=True",
     lambda c: c.chat.invoke("hi", num_speculative_tokens=True), _TYPE,
     ("num_speculative_tokens", "True")),
    ("chat", "top_k=True", lambda c: c.chat.invoke("hi", top_k=True), _TYPE, ("top_k", "True")),
    ("chat", "bind max_tokens=True", lambda c: c.chat.bind(max_tokens=True).invoke("hi"), _TYPE,
     ("max_tokens", "True")),
    *[("chat", f"engine {name}=True", lambda c, name=name: _engine(c, **{name: True}), _TYPE,
       (name, "True"))
      for name in ("max_batch_size", "max_num_batched_tokens", "num_blocks", "block_size",
                   "max_context_length", "stream_buffer_limit")],
    ("chat", "engine kv_cache_memory_fraction=True",
     lambda c: _engine(c, kv_cache_memory_fraction=True), _TYPE,
     ("kv_cache_memory_fraction", "True")),
    ("chat", "engine enable_prefix_caching=1", lambda c: _engine(c, enable_prefix_caching=1),
     _TYPE, ("enable_prefix_caching", "1")),
    *[("chat", f"SamplingParams {name}=True",
       lambda c, name=name: _generate(c, **{name: True}), _TYPE, (name, "True"))
      for name in ("max_tokens", "top_k", "num_speculative_tokens", "seed")],
    ("chat", "SamplingParams stop_token_ids=[True]", lambda c: _generate(c, stop_token_ids=[True]),
     _TYPE, ("stop_token_ids[0]", "True")),
    ("chat", "agent max_hops=True", lambda c: _agent(c, max_hops=True), _TYPE,
     ("max_hops", "True")),
    ("store", "mmr k=True", lambda c: c.store.max_marginal_relevance_search("x", k=True),
     _STORE_TYPE, ("k", "True")),
    ("store", "mmr fetch_k=True",
     lambda c: c.store.max_marginal_relevance_search("x", fetch_k=True), _STORE_TYPE,
     ("fetch_k", "True")),
    ("store", "retriever k=True",
     lambda c: c.store.as_retriever(search_kwargs={"k": True}).invoke("x"), _STORE_TYPE,
     ("k", "True")),
    ("store", "similarity_search_with_score k=True",
     lambda c: c.store.similarity_search_with_score("x", k=True), _STORE_TYPE, ("k", "True")),
    *[("store", f"ivf {name}=True", lambda c, name=name: _ivf(**{name: True}), _STORE_TYPE,
       (name, "True"))
      for name in ("nlist", "nprobe", "ivf_min_train_size")],
    ("embeddings", "plan_batches batch_size=True", lambda c: _plan_batches(batch_size=True),
     _STORE_TYPE, ("batch_size", "True")),
    ("embeddings", "plan_batches max_batch_tokens=True",
     lambda c: _plan_batches(max_batch_tokens=True), _STORE_TYPE, ("max_batch_tokens", "True")),
    *[("executor", f"{name}=True",
       lambda c, name=name: NPUStreamToolExecutor([add], **{name: True}), _TYPE,
       (name, "True"))
      for name in ("max_concurrency", "max_abandoned_threads", "timeout_ms",
                   "retry_backoff_ms")],
    ("executor", "config max_concurrency=True",
     lambda c: c.executor.invoke([_call()], config={"max_concurrency": True}), _TYPE,
     ("max_concurrency", "True")),
]


def _agent(c: Ctx, **options: Any) -> Any:
    from langchain_ascend.agent import create_ascend_agent

    return create_ascend_agent(c.chat, [add], executor=c.executor, **options)


def _plan_batches(**counts: Any) -> Any:
    from langchain_ascend.embeddings import plan_batches

    return plan_batches([3, 1], **{"batch_size": 8, "max_batch_tokens": 64, **counts})


ALL = CHAT + EMBEDDINGS + STORE + EXECUTOR + TRUE_COUNTS


@pytest.mark.parametrize(("component", "case", "action", "types", "needles"), ALL,
                         ids=[f"{c[0]}: {c[1]}" for c in ALL])
def test_bad_input(ctx: Ctx, component: str, case: str, action: Callable[[Ctx], Any],
                   types: tuple[type[BaseException], ...], needles: tuple[str, ...]) -> None:
    with pytest.raises(LangChainAscendError) as info:
        action(ctx)
    for expected in types:
        assert isinstance(info.value, expected), (case, type(info.value).__mro__)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (case, needle, message)
    _normal(component, ctx)


@pytest.mark.parametrize(("case", "kwargs", "needle"), CONSTRUCT,
                         ids=[f"chat ctor: {c[0]}" for c in CONSTRUCT])
def test_bad_chat_construction(ctx: Ctx, case: str, kwargs: dict[str, Any],
                               needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        AscendChatModel(model=ctx.chat_path, **kwargs)
    assert needle in str(info.value)
    causes = [e.get("ctx", {}).get("error") for e in info.value.errors()]
    assert any(isinstance(cause, LangChainAscendError) for cause in causes), causes
    _normal("chat", ctx)


@pytest.mark.parametrize("field", ["batch_size", "max_batch_tokens", "max_seq_length"])
def test_bool_counts_are_refused_by_embeddings(field: str) -> None:
    with pytest.raises(ValidationError, match=field) as info:
        AscendEmbeddings(model=str(minilm_path()), device="cpu", **{field: True})
    causes = [e.get("ctx", {}).get("error") for e in info.value.errors()]
    assert any(isinstance(cause, VectorStoreArgumentTypeError) for cause in causes), causes


# ---- the sequence rule: a str is one item where that is unambiguous ---------------------

def test_str_is_one_item_where_unambiguous(ctx: Ctx) -> None:
    store = AscendFAISS.from_texts(["x", "y", "some-id"], DeterministicFakeEmbedding(size=8),
                                   ids=["s", "o", "some-id"], device="cpu")
    assert [d.id for d in store.get_by_ids("some-id")] == ["some-id"]
    assert store.delete("some-id") is True
    assert sorted(d.id for d in store.get_by_ids(["s", "o", "some-id"])) == ["o", "s"]
    assert store.add_texts(["z"], ids="z1") == ["z1"]
    llm = AscendChatModel(model=ctx.chat_path, device="cpu", stop="###")
    assert llm.stop == ["###"]
    stopped = ctx.chat.invoke("hello", max_tokens=6, stop="zzzz")
    free = ctx.chat.invoke("hello", max_tokens=6)
    assert stopped.content == free.content  # not six single-letter stops
    assert ctx.chat.bind_tools(add).kwargs["tools"][0]["function"]["name"] == "add"


def test_forced_tool_call_cut_at_max_tokens_says_so(ctx: Ctx) -> None:
    message = ctx.chat.bind_tools([add], tool_choice="add").invoke("add 1 and 2", max_tokens=3)
    assert message.response_metadata["finish_reason"] == "length"
    assert not message.tool_calls
    (entry,) = message.invalid_tool_calls
    assert "cut at max_tokens=3" in entry["error"]
    assert "max_tokens=3" in message.response_metadata["output_error"]
    chunks = list(ctx.chat.bind_tools([add], tool_choice="required").stream(
        "add 1 and 2", max_tokens=3))
    assert "cut at max_tokens=3" in chunks[-1].response_metadata["output_error"]


def test_matrix_size() -> None:
    assert len(ALL) + len(CONSTRUCT) >= 60
