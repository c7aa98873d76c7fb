"""Engine settings. Sharing is explicit: one process-wide engine per (model, device, dtype,
engine settings); a caller whose settings differ from a running engine's gets an engine of its
own with those settings, never the running one with its settings silently dropped. The default
KV pool is sized by the model and the batch (a token cap), not by the free memory alone."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch")

from langchain_core.messages import HumanMessage  # noqa: E402

from langchain_ascend.chat_models import AscendChatModel  # noqa: E402
from langchain_ascend.engine import shared_engines  # noqa: E402
from langchain_ascend.engine.llm_engine import LLMEngine  # noqa: E402
from langchain_ascend.engine.shared_engines import get_engine  # noqa: E402
from langchain_ascend.engine.worker.kv_cache import (  # noqa: E402
    DEFAULT_MAX_KV_TOKENS,
    plan_num_blocks,
)
from langchain_ascend.errors import InvalidRequestError, PromptTooLongError  # noqa: E402

SMALL = {"num_blocks": 48, "block_size": 4, "max_num_batched_tokens": 256}


@pytest.fixture
def engines():
    made = []
    yield made
    for engine in made:
        engine.shutdown()


def test_get_engine_keys_by_settings(tiny_qwen2_path, engines):
    first = get_engine(tiny_qwen2_path, device="cpu", dtype="float32", **SMALL)
    engines.append(first)
    assert get_engine(tiny_qwen2_path, device="cpu", dtype="float32", **SMALL) is first
    # a default passed explicitly is the same setting as leaving it out
    assert get_engine(tiny_qwen2_path, device="cpu", dtype="float32", max_batch_size=64,
                      **SMALL) is first
    limited = get_engine(tiny_qwen2_path, device="cpu", dtype="float32",
                         max_context_length=64, **SMALL)
    engines.append(limited)
    assert limited is not first and not first.is_closed
    assert limited.max_context_length == 64 and first.max_context_length > 64
    # asking for nothing in particular asks for the default settings: neither engine above,
    # and the same engine on every such call (left running: other tests share it)
    defaults = get_engine(tiny_qwen2_path, device="cpu", dtype="float32")
    assert defaults is not first and defaults is not limited
    assert get_engine(tiny_qwen2_path, device="cpu", dtype="float32") is defaults
    with pytest.raises(PromptTooLongError, match="max_context_length=64"):
        limited.generate([5] * 70)
    assert first.generate([5] * 70).token_ids is not None
    limited.shutdown()  # a closed engine is replaced on the next call
    again = get_engine(tiny_qwen2_path, device="cpu", dtype="float32", max_context_length=64,
                       **SMALL)
    engines.append(again)
    assert again is not limited and not again.is_closed
    assert limited not in shared_engines._REGISTRY.values()  # the closed one was dropped


def test_get_engine_refuses_an_unknown_setting(tiny_qwen2_path):
    with pytest.raises(InvalidRequestError, match="'max_ctx' is not an engine setting"):
        get_engine(tiny_qwen2_path, device="cpu", max_ctx=64)


def test_two_chat_models_with_different_limits_get_their_own_engines(tiny_qwen2_path,
                                                                     engines):
    common = {"model": str(tiny_qwen2_path), "device": "cpu", "dtype": "float32",
              "temperature": 0, "max_tokens": 2, "num_kv_blocks": 128, "block_size": 4}
    roomy = AscendChatModel(**common)
    strict = AscendChatModel(**common, max_context_length=64)
    twin = AscendChatModel(**common)
    long_question = [HumanMessage("word " * 40)]
    roomy_engine = roomy._engine_for()
    strict_engine = strict._engine_for()
    engines.extend([roomy_engine, strict_engine])
    assert strict_engine is not roomy_engine
    assert twin._engine_for() is roomy_engine  # same settings: one shared engine
    assert strict_engine.max_context_length == 64
    with pytest.raises(PromptTooLongError):
        strict.invoke(long_question)
    assert roomy.invoke(long_question).usage_metadata["output_tokens"] >= 1
    assert strict.invoke([HumanMessage("hi")]).content is not None
    assert set(shared_engines._REGISTRY.values()) >= {roomy_engine, strict_engine}


def test_plan_num_blocks_caps_the_default_pool_by_tokens():
    import torch

    cpu = torch.device("cpu")
    plan = {"device": cpu, "bytes_per_block": 1024, "memory_fraction": 1.0,
            "cpu_cap_bytes": 2**40}
    assert plan_num_blocks(**plan, block_size=16, max_num_tokens=1000) == 63  # ceil(1000/16)
    assert plan_num_blocks(**plan, block_size=16) == DEFAULT_MAX_KV_TOKENS // 16
    assert plan_num_blocks(**plan, block_size=16, max_num_tokens=10**9) == \
        DEFAULT_MAX_KV_TOKENS // 16
    assert plan_num_blocks(**plan, block_size=16, max_num_tokens=1) == 2  # MIN_NUM_BLOCKS
    # an explicit count wins over every cap; the memory bound still caps the token cap
    assert plan_num_blocks(**plan, block_size=16, max_num_tokens=16, num_blocks=50_000) == \
        50_000
    small_memory = {**plan, "cpu_cap_bytes": 10 * 1024}
    assert plan_num_blocks(**small_memory, block_size=16, max_num_tokens=10**5) == 10
    with pytest.raises(ValueError, match="max_num_tokens"):
        plan_num_blocks(**plan, block_size=16, max_num_tokens=0)


def _bytes_per_block(engine):
    cache = engine.driver.runner.kv_cache
    return cache.num_bytes // cache.num_blocks


def test_the_tiny_models_default_pool_is_sized_by_its_batch_and_context(tiny_qwen2_path):
    engine = LLMEngine(tiny_qwen2_path, device="cpu", dtype="float32", max_batch_size=4,
                       max_context_length=64, block_size=16)
    try:
        assert engine.num_blocks == 4 * 64 // 16  # room for a full batch at full length
        assert engine.driver.runner.kv_cache.num_bytes == (16 + 1) * _bytes_per_block(engine)
        assert engine.driver.runner.kv_cache.num_bytes == 17 * 16 * 1024  # 1 KiB per token
    finally:
        engine.shutdown()
    explicit = LLMEngine(tiny_qwen2_path, device="cpu", dtype="float32", max_batch_size=4,
                         max_context_length=64, block_size=16, num_blocks=100)
    try:
        assert explicit.num_blocks == 100  # num_blocks= overrides the cap
    finally:
        explicit.shutdown()


def test_the_tiny_models_default_pool_is_small(tiny_qwen2_path):
    """All defaults: 64 requests x the model's 4096 positions = 256k tokens, the fixed cap too:
    256 MiB for this model instead of a share of the free RAM (2 GiB before)."""
    engine = LLMEngine(tiny_qwen2_path, device="cpu", dtype="float32")
    try:
        assert engine.num_blocks * engine.block_size == DEFAULT_MAX_KV_TOKENS
        assert engine.driver.runner.kv_cache.num_bytes == \
            (DEFAULT_MAX_KV_TOKENS // engine.block_size + 1) * _bytes_per_block(engine)
        assert engine.driver.runner.kv_cache.num_bytes <= 256 * 2**20 + _bytes_per_block(engine)
    finally:
        engine.shutdown()


def test_an_engine_no_chat_model_holds_is_freed_when_another_starts(tiny_qwen2_path):
    """A chat model built per call (LangChain's configurable_fields does) reuses the engine
    of the last one; a notebook rebuilding its model with other settings does not keep every
    earlier engine: one nobody holds is shut down before the next engine loads. A copy with
    other engine settings gets an engine of its own."""
    settings = {"model": str(tiny_qwen2_path), "device": "cpu", "max_tokens": 2,
                "num_kv_blocks": 64}
    chat = AscendChatModel(max_context_length=200, **settings)
    chat.invoke("hi")
    engine = chat._engine_for()
    same = chat.model_copy(update={"max_tokens": 3})
    other_chat = chat.model_copy(update={"max_context_length": 150})
    assert same._engine_for() is engine
    other = other_chat._engine_for()
    assert other is not engine and other.max_context_length == 150
    del chat
    gc.collect()
    assert same.invoke("hi").usage_metadata["output_tokens"] == 3  # the copy holds it
    del same
    gc.collect()
    per_call = AscendChatModel(max_context_length=200, **settings)  # nothing holds engine
    assert per_call._engine_for() is engine and not engine.is_closed  # reused, not reloaded
    del per_call, other_chat
    gc.collect()
    assert not engine.is_closed and not other.is_closed  # kept until another engine starts
    rebuilt = AscendChatModel(max_context_length=180, **settings)
    assert rebuilt.invoke("hi").content is not None
    assert engine.is_closed and other.is_closed  # shut down before the new one loaded
    assert engine not in shared_engines._REGISTRY.values()


def test_an_engine_handed_out_stays_after_its_chat_model(tiny_qwen2_path):
    chat = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", max_tokens=2,
                           max_context_length=170, num_kv_blocks=64)
    engine = chat.get_engine()
    del chat
    gc.collect()
    started = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", max_tokens=2,
                              max_context_length=160, num_kv_blocks=64)
    started.invoke("hi")  # another engine starts: a pinned one stays
    assert not engine.is_closed and engine.generate([5, 6, 7]).token_ids is not None
    engine.shutdown()
