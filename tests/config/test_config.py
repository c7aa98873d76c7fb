"""Configs build real components whose fields (and behaviour) are what the config says."""

from __future__ import annotations

import time
import warnings

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from langchain_ascend import platform
from langchain_ascend.config import AgentComponents, ConfigError, load_config
from langchain_ascend.errors import DeviceUnavailableError
from langchain_ascend.testing import minilm_path


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text


def _call(name: str, call_id: str, **args):
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


@pytest.fixture(scope="module")
def minilm_embeddings():
    """One loaded MiniLM kept alive, so every config's AscendEmbeddings reuses its weights."""
    from langchain_ascend.embeddings import AscendEmbeddings

    return AscendEmbeddings(model=str(minilm_path()), device="cpu")


def _cpu_only() -> bool:
    return not platform.probe_npu().available and bool(platform.cuda_reason())


def test_yaml_builds_every_component(tmp_path, tiny_qwen2_path, minilm_embeddings):
    cfg = tmp_path / "agent_config.yaml"
    cfg.write_text(
        f"npu:\n  device: cpu\nmodel:\n  path: {tiny_qwen2_path}\n  max_tokens: 4\n"
        f"embeddings:\n  model: {minilm_path()}\n"
        "vectorstore:\n  texts: [alpha beta, gamma delta, NPUs are fast]\n"
        "  distance_strategy: COSINE\n  k: 1\n"
        "tools:\n  timeout_ms: 500\n  retry_times: 0\n"
    )
    built = load_config(cfg, tools=[echo])
    assert built.config is not None and built.agent is None
    assert built.chat_model.max_tokens == 4 and built.chat_model.device == "cpu"
    reply = built.chat_model.invoke("hi")
    assert reply.usage_metadata["output_tokens"] <= 4
    assert built.vectorstore.distance_strategy.value == "COSINE"
    docs = built.vectorstore.similarity_search("NPUs are fast", k=1)
    assert docs[0].page_content == "NPUs are fast"
    assert [d.page_content for d in built.retriever.invoke("NPUs are fast")] == ["NPUs are fast"]
    out = built.tool_executor.invoke([_call("echo", "c1", text="x")])
    assert out[0].content == "x" and out[0].tool_call_id == "c1"
    assert sorted(built.tool_executor.tools_by_name) == ["echo", "search_docs"]
    assert [t.name for t in built.tools] == ["echo", "search_docs"]
    found = built.tool_executor.invoke([_call("search_docs", "c2", query="NPUs are fast")])
    assert found[0].content == "NPUs are fast"


def test_model_keys_reach_the_chat_model(tiny_qwen2_path):
    model = {
        "path": str(tiny_qwen2_path), "dtype": "float32", "kv_cache_policy": "paged",
        "max_context_length": 256, "block_size": 16, "num_kv_blocks": 64,
        "kv_cache_memory_fraction": 0.25, "enable_prefix_caching": False, "max_batch_size": 4,
        "compile": False, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "seed": 7,
    }
    chat = load_config({"npu": {"device": "cpu"}, "model": model}).chat_model
    assert chat.model == str(tiny_qwen2_path) and chat.device == "cpu"
    for key, value in model.items():
        if key not in ("path", "kv_cache_policy"):
            assert getattr(chat, key) == value, key


def test_unset_model_keys_keep_the_chat_model_defaults(tiny_qwen2_path, monkeypatch):
    from langchain_ascend.chat_models import AscendChatModel

    monkeypatch.setenv("LANGCHAIN_ASCEND_MODEL", str(tiny_qwen2_path))
    chat = load_config({"model": None}).chat_model
    reference = AscendChatModel()
    assert chat.model == str(tiny_qwen2_path)
    for key in ("device", "dtype", "block_size", "compile", "max_tokens", "temperature",
                "kv_cache_memory_fraction", "max_batch_size"):
        assert getattr(chat, key) == getattr(reference, key), key


def test_gguf_file_reaches_the_chat_model(tmp_path):
    from langchain_ascend.errors import ModelSourceError

    with pytest.raises(ModelSourceError, match="other.gguf"):
        load_config({"model": {"path": str(tmp_path), "gguf_file": "other.gguf"}})


def test_speculation_keys_pass_through_when_the_chat_model_has_them(tiny_qwen2_path):
    from langchain_ascend.chat_models import AscendChatModel

    if "speculative_decoding" not in AscendChatModel.model_fields:
        pytest.skip("this AscendChatModel has no speculation (the refusal is tested instead)")
    chat = load_config({"model": {"path": str(tiny_qwen2_path), "speculative_decoding": "off",
                                  "num_speculative_tokens": 2}}).chat_model
    assert (chat.speculative_decoding, chat.num_speculative_tokens) == ("off", 2)


@pytest.mark.parametrize(
    ("npu", "device"),
    [
        ({"device": "npu", "context": {"device_id": 1}}, "npu:1"),
        ({"device": "cuda", "context": {"device_id": 2}}, "cuda:2"),
        ({"device": "npu"}, "npu"),
        ({"device": "cpu", "context": {"device_id": 0}}, "cpu"),
        ({}, "auto"),
    ],
)
def test_device_id_maps_to_the_device_string(npu, device, tiny_qwen2_path):
    # The chat model checks the spelling only, so npu:1 builds here and fails at first use.
    built = load_config({"npu": npu, "model": {"path": str(tiny_qwen2_path)}})
    assert built.chat_model.device == device


@pytest.mark.skipif(not _cpu_only(), reason="auto finds an accelerator on this machine")
def test_device_id_under_auto_on_a_cpu_machine_is_cpu(tiny_qwen2_path):
    built = load_config({"npu": {"context": {"device_id": 3}},
                         "model": {"path": str(tiny_qwen2_path)}})
    assert built.chat_model.device == "cpu"


def test_tools_timeout_ms_times_out_a_slow_tool():
    @tool
    def slow() -> str:
        """Sleep."""
        time.sleep(0.5)
        return "late"

    executor = load_config({"npu": {"device": "cpu"}, "tools": {"timeout_ms": 50}},
                           tools=[slow]).tool_executor
    assert executor.timeout_ms == 50
    out = executor.invoke([_call("slow", "c1")])
    assert out[0].status == "error"
    assert out[0].response_metadata["tool_timing"]["timed_out"] is True


@pytest.mark.parametrize(("retry_times", "status"), [(2, "success"), (1, "error")])
def test_tools_retry_times_retries_a_flaky_tool(retry_times, status):
    failures = {"left": 2}

    @tool
    def flaky() -> str:
        """Fail twice, then work."""
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("down")
        return "up"

    tools_cfg = {"retry_times": retry_times, "retry_backoff_ms": 0}
    executor = load_config({"npu": {"device": "cpu"}, "tools": tools_cfg},
                           tools=[flaky]).tool_executor
    out = executor.invoke([_call("flaky", "c1")])
    assert out[0].status == status
    timing = out[0].response_metadata["tool_timing"]
    assert timing["retries"] == retry_times
    assert timing["retry_wait_ms"] == 0  # retry_backoff_ms: 0 (the default waits >= 50 ms)


def test_tools_retry_backoff_ms_sets_the_wait():
    failures = {"left": 1}

    @tool
    def flaky() -> str:
        """Fail once, then work."""
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("down")
        return "up"

    tools_cfg = {"retry_times": 1, "retry_backoff_ms": 200}
    out = load_config({"tools": tools_cfg}, tools=[flaky]).tool_executor.invoke(
        [_call("flaky", "c1")])
    assert out[0].status == "success"
    assert 100 <= out[0].response_metadata["tool_timing"]["retry_wait_ms"] <= 400


def test_tools_retry_on_timeout_retries_a_timed_out_attempt():
    attempts = {"n": 0}

    @tool
    def stall_once() -> str:
        """Stall on the first attempt."""
        attempts["n"] += 1
        if attempts["n"] == 1:
            time.sleep(0.4)
        return "ok"

    tools_cfg = {"timeout_ms": 100, "retry_times": 1, "retry_on_timeout": True,
                 "retry_backoff_ms": 0}
    out = load_config({"npu": {"device": "cpu"}, "tools": tools_cfg},
                      tools=[stall_once]).tool_executor.invoke([_call("stall_once", "c1")])
    assert (out[0].status, out[0].content) == ("success", "ok")
    assert out[0].response_metadata["tool_timing"]["attempts"] == 2


@pytest.mark.parametrize("parallel", [True, False])
def test_tools_enable_parallel(parallel):
    @tool
    def nap(tag: str) -> str:
        """Sleep a little."""
        time.sleep(0.15)
        return tag

    executor = load_config({"npu": {"device": "cpu"}, "tools": {"enable_parallel": parallel}},
                           tools=[nap]).tool_executor
    assert executor.enable_parallel is parallel
    first, second = (m.response_metadata["tool_timing"]
                     for m in executor.invoke([_call("nap", "a", tag="a"),
                                               _call("nap", "b", tag="b")]))
    overlapped = second["start_ms"] < first["end_ms"]
    assert overlapped is parallel


def test_tools_max_concurrency_reaches_the_executor():
    executor = load_config({"tools": {"max_concurrency": 3}}, tools=[echo]).tool_executor
    assert executor.max_concurrency == 3


def test_enable_async_false_gives_the_executor_no_device_streams():
    cfg = {"npu": {"device": "npu", "context": {"device_id": 7},
                   "stream": {"enable_async": False}}, "tools": {}}
    executor = load_config(cfg, tools=[echo]).tool_executor
    assert executor._device_request is None and executor.device == "cpu"
    assert executor.invoke([_call("echo", "c1", text="y")])[0].content == "y"


@pytest.mark.skipif(platform.probe_npu().available, reason="an NPU is present")
def test_enable_async_true_puts_the_executor_on_the_config_device():
    cfg = {"npu": {"device": "npu", "context": {"device_id": 7}}, "tools": {}}
    with pytest.raises(DeviceUnavailableError, match="npu:7"):
        load_config(cfg, tools=[echo])


def test_tools_section_needs_a_tool_to_run():
    with pytest.raises(ConfigError, match="tools=") as info:
        load_config({"tools": {"timeout_ms": 10}})
    assert info.value.issues[0].path == "tools"


def test_no_sections_build_nothing():
    assert load_config({}) == AgentComponents(config=load_config({}).config)


def test_embeddings_keys_reach_the_embeddings(minilm_embeddings):
    built = load_config({"npu": {"device": "npu"},
                         "embeddings": {"model": str(minilm_path()), "device": "cpu",
                                        "batch_size": 8}})
    emb = built.embeddings
    assert (emb.model, emb.device, emb.batch_size) == (str(minilm_path()), "cpu", 8)
    assert built.vectorstore is None and built.chat_model is None


def test_embeddings_follow_the_npu_device(minilm_embeddings):
    emb = load_config({"npu": {"device": "cpu"},
                       "embeddings": {"model": str(minilm_path())}}).embeddings
    assert emb.device == "cpu"


def test_vectorstore_from_texts_file_with_strategy_k_and_tool(tmp_path, minilm_embeddings):
    (tmp_path / "docs.txt").write_text("paged KV cache\n\nprefix caching\nstreams per tool\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"npu: {{device: cpu}}\nembeddings: {{model: {minilm_path()}}}\n"
        "vectorstore:\n  texts_file: docs.txt\n  distance_strategy: EUCLIDEAN_DISTANCE\n"
        "  normalize_L2: true\n  k: 2\n  tool_name: kb\n  tool_description: Our notes.\n")
    built = load_config(cfg)
    store = built.vectorstore
    assert len(store) == 3 and str(store.device) == "cpu"
    assert store.distance_strategy.value == "EUCLIDEAN_DISTANCE" and store._normalize_L2
    assert len(built.retriever.invoke("caching")) == 2
    assert [(t.name, t.description) for t in built.tools] == [("kb", "Our notes.")]
    assert sorted(built.tool_executor.tools_by_name) == ["kb"]


def test_vectorstore_path_loads_a_saved_store(tmp_path, minilm_embeddings):
    from langchain_ascend.vectorstores import AscendFAISS

    AscendFAISS.from_texts(["one fish", "two fish"], minilm_embeddings,
                           device="cpu").save_local(str(tmp_path / "kb"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"npu: {{device: cpu}}\nembeddings: {{model: {minilm_path()}}}\n"
                   "vectorstore: {path: kb}\n")
    store = load_config(cfg).vectorstore
    assert sorted(d.page_content for d in store.similarity_search("fish", k=2)) == [
        "one fish", "two fish"]


def test_vectorstore_missing_sources_name_the_key(tmp_path, minilm_embeddings):
    emb = {"model": str(minilm_path()), "device": "cpu"}
    with pytest.raises(ConfigError, match="no saved index folder") as info:
        load_config({"embeddings": emb, "vectorstore": {"path": str(tmp_path / "none")}})
    assert info.value.issues[0].path == "vectorstore.path"
    with pytest.raises(ConfigError, match="file not found") as info:
        load_config({"embeddings": emb, "vectorstore": {"texts_file": str(tmp_path / "x")}})
    assert info.value.issues[0].path == "vectorstore.texts_file"


def test_allow_dangerous_deserialization_gates_a_langchain_faiss_folder(tmp_path,
                                                                       minilm_embeddings):
    from langchain_ascend.errors import LangChainAscendError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.vectorstores import FAISS
    FAISS.from_texts(["red", "blue"], minilm_embeddings).save_local(str(tmp_path / "lc"))
    section = {"path": str(tmp_path / "lc")}
    emb = {"model": str(minilm_path()), "device": "cpu"}
    with pytest.raises(LangChainAscendError, match="allow_dangerous_deserialization"):
        load_config({"embeddings": emb, "vectorstore": section})
    store = load_config({"embeddings": emb, "vectorstore": {
        **section, "allow_dangerous_deserialization": True}}).vectorstore
    assert store.similarity_search("red", k=1)[0].page_content == "red"


def test_load_agent_config_builds_the_agent(tiny_qwen2_path, minilm_embeddings):
    pytest.importorskip("langchain_ascend.agent")
    from langchain_ascend.config import load_agent_config

    cfg = {
        "npu": {"device": "cpu"},
        "model": {"path": str(tiny_qwen2_path), "max_tokens": 3, "temperature": 0},
        "embeddings": {"model": str(minilm_path())},
        "vectorstore": {"texts": ["alpha", "beta"], "k": 1},
        "tools": {"timeout_ms": 1000},
        "agent": {"max_hops": 2, "system_prompt": "Be brief.",
                  "first_hop_tool_choice": "required", "final_hop_tool_choice": "none"},
    }
    parts = load_agent_config(cfg, tools=[echo])
    agent = parts.agent
    assert agent.max_hops == 2 and agent.system_prompt == "Be brief."
    assert agent.executor is parts.tool_executor
    assert sorted(parts.tool_executor.tools_by_name) == ["echo", "search_docs"]
    first, last = (m.kwargs for m in agent.models)
    assert first["tool_choice"] == "required" and last["tool_choice"] == "none"
    result = agent.invoke("hi")
    assert isinstance(result["messages"][-1], AIMessage)


def test_load_agent_config_builds_a_default_agent(tiny_qwen2_path, monkeypatch):
    pytest.importorskip("langchain_ascend.agent")
    from langchain_ascend.config import load_agent_config

    monkeypatch.setenv("LANGCHAIN_ASCEND_MODEL", str(tiny_qwen2_path))
    parts = load_agent_config({"npu": {"device": "cpu"}})
    assert parts.agent.max_hops == 8 and parts.agent.system_prompt is None
    assert parts.tool_executor is not None and parts.embeddings is None


def test_tools_timeout_ms_null_means_no_deadline():
    assert load_config({"tools": {}}, tools=[echo]).tool_executor.timeout_ms == 15000
    assert load_config({"tools": {"timeout_ms": None}}, tools=[echo]).tool_executor.timeout_ms is None
