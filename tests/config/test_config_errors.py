"""Every kind of invalid config gets a ConfigError naming the key path, file, line and what
is allowed. Only validation runs here: no component is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from langchain_ascend.config import ConfigError, read_config
from langchain_ascend.config import schema as schema_mod
from langchain_ascend.config.schema import AgentConfig, known_paths
from langchain_ascend.errors import LangChainAscendError


def _issue(data, path):
    """The single issue a bad config raises; asserts it names ``path``."""
    with pytest.raises(ConfigError) as info:
        read_config(data)
    issues = info.value.issues
    assert [i.path for i in issues] == [path], str(info.value)
    assert path in str(info.value)
    return issues[0]


def test_config_error_is_a_typed_value_error():
    assert issubclass(ConfigError, LangChainAscendError)
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("data", "path", "allowed"),
    [
        ({"npus": {}}, "npus", "npu, model, tools, embeddings, vectorstore, agent"),
        ({"npu": {"ctx": {}}}, "npu.ctx", "device, context, stream, memory"),
        ({"npu": {"context": {"id": 0}}}, "npu.context.id", "device_id, priority"),
        ({"npu": {"stream": {"async": True}}}, "npu.stream.async", "enable_async"),
        ({"model": {"name": "x"}}, "model.name", "path, gguf_file"),
        ({"tools": {"timeout": 5}}, "tools.timeout", "timeout_ms, retry_times"),
        ({"embeddings": {"dev": "cpu"}}, "embeddings.dev", "model, device, batch_size"),
        ({"vectorstore": {"texts": ["a"], "top_k": 2}}, "vectorstore.top_k", "path, texts"),
        ({"agent": {"hops": 2}}, "agent.hops", "max_hops, system_prompt"),
    ],
)
def test_unknown_key_at_each_level(data, path, allowed):
    issue = _issue(data, path)
    assert issue.message.startswith("unknown key")
    assert f"allowed here: {allowed}" in issue.message


@pytest.mark.parametrize(
    ("data", "path", "suggestion"),
    [
        ({"npu": {"memory": {"enable_mem_pol": True}}}, "npu.memory.enable_mem_pol",
         "enable_mem_pool"),
        ({"model": {"temprature": 0.1}}, "model.temprature", "temperature"),
        ({"tools": {"retry_time": 1}}, "tools.retry_time", "retry_times"),
        ({"tool": {}}, "tool", "tools"),
        ({"npu": {"contxt": {}}}, "npu.contxt", "context"),
    ],
)
def test_misspelt_key_gets_the_closest_known_one(data, path, suggestion):
    issue = _issue(data, path)
    assert f"did you mean {suggestion!r}?" in issue.message


def test_misspelling_of_a_refused_key_says_it_is_refused_too():
    issue = _issue({"npu": {"memory": {"max_host_memry_mb": 1024}}},
                   "npu.memory.max_host_memry_mb")
    assert "did you mean 'max_host_memory_mb'?" in issue.message
    assert "not supported either" in issue.message


def test_key_in_the_wrong_section_names_where_it_belongs():
    issue = _issue({"model": {"timeout_ms": 100}}, "model.timeout_ms")
    assert "belongs at tools.timeout_ms" in issue.message


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        ({"npu": {"context": {"device_id": "0"}}}, "npu.context.device_id", "valid integer"),
        ({"npu": {"stream": {"enable_async": "yes"}}}, "npu.stream.enable_async",
         "valid boolean"),
        ({"npu": {"device": "gpu"}}, "npu.device", "'auto', 'npu', 'cuda' or 'cpu'"),
        ({"model": {"max_tokens": True}}, "model.max_tokens", "valid integer, got True"),
        ({"model": {"temperature": "0.5"}}, "model.temperature", "valid number"),
        ({"model": {"dtype": "fp8"}}, "model.dtype", "'float32', 'bfloat16' or 'float16'"),
        ({"model": {"compile": "yes"}}, "model.compile", "valid boolean, got 'yes'; or Input "
                                                         "should be 'auto'"),
        ({"model": {"speculative_decoding": "medusa"}}, "model.speculative_decoding",
         "'auto', 'prompt_lookup' or 'off'"),
        ({"tools": {"enable_parallel": 1}}, "tools.enable_parallel", "valid boolean"),
        ({"vectorstore": {"texts": ["a", 3]}}, "vectorstore.texts[1]", "valid string, got 3"),
        ({"vectorstore": {"texts": ["a"], "distance_strategy": "JACCARD"}},
         "vectorstore.distance_strategy", "'COSINE'"),
        ({"agent": {"system_prompt": ["a"]}}, "agent.system_prompt", "valid string"),
    ],
)
def test_wrong_type(data, path, needle):
    assert needle in _issue(data, path).message


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        ({"npu": {"context": {"device_id": -1}}}, "npu.context.device_id",
         "greater than or equal to 0"),
        ({"model": {"max_context_length": 0}}, "model.max_context_length",
         "greater than or equal to 1"),
        ({"model": {"kv_cache_memory_fraction": 1.5}}, "model.kv_cache_memory_fraction",
         "less than or equal to 1"),
        ({"model": {"top_p": 0}}, "model.top_p", "greater than 0"),
        ({"model": {"temperature": -0.1}}, "model.temperature", "greater than or equal to 0"),
        ({"tools": {"timeout_ms": 0}}, "tools.timeout_ms", "greater than 0, got 0"),
        ({"tools": {"retry_times": -1}}, "tools.retry_times", "greater than or equal to 0"),
        ({"agent": {"max_hops": 0}}, "agent.max_hops", "greater than or equal to 1"),
        ({"model": {"path": ""}}, "model.path", "must not be empty"),
        ({"vectorstore": {"texts": []}}, "vectorstore.texts", "at least 1 item"),
        ({"vectorstore": {"texts": ["a"], "tool_name": "two words"}},
         "vectorstore.tool_name", "should match pattern"),
    ],
)
def test_out_of_range(data, path, needle):
    assert needle in _issue(data, path).message


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        ({"npu": {"context": {"priority": 1}}}, "npu.context.priority",
         "no per-agent ACL context"),
        ({"npu": {"context": {"priority": None}}}, "npu.context.priority",
         "no per-agent ACL context"),
        ({"npu": {"memory": {"max_host_memory_mb": 4096}}}, "npu.memory.max_host_memory_mb",
         "model.num_kv_blocks or model.kv_cache_memory_fraction"),
        ({"npu": {"stream": {"sync_mode": "sync"}}}, "npu.stream.sync_mode",
         "ASCEND_LAUNCH_BLOCKING"),
        ({"npu": {"memory": {"enable_mem_pool": False}}}, "npu.memory.enable_mem_pool",
         "no unpooled KV cache"),
        ({"model": {"kv_cache_policy": "contiguous"}}, "model.kv_cache_policy",
         "allowed: 'paged'"),
        ({"npu": {"device": "cpu", "context": {"device_id": 1}}}, "npu",
         "no device index"),
    ],
)
def test_key_we_cannot_honour_is_rejected_with_the_reason(data, path, reason):
    issue = _issue(data, path)
    assert reason in issue.message


def test_speculation_keys_are_refused_when_the_chat_model_lacks_them(monkeypatch):
    monkeypatch.setattr(schema_mod, "_chat_model_fields", lambda: {"model": None})
    with pytest.raises(ConfigError) as info:
        read_config({"model": {"speculative_decoding": "prompt_lookup",
                               "num_speculative_tokens": 3}})
    assert [i.path for i in info.value.issues] == ["model.speculative_decoding",
                                                   "model.num_speculative_tokens"]
    assert all("not supported by this version" in i.message for i in info.value.issues)


def test_vectorstore_needs_exactly_one_source():
    for data in ({"vectorstore": {"texts": ["a"], "path": "p"}}, {"vectorstore": None}):
        assert "exactly one of 'path'" in _issue(data, "vectorstore").message


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        ({"npu": [1]}, "npu", "mapping of keys (device, context, stream, memory), got list"),
        ({"model": "x.gguf"}, "model", "mapping of keys (path, gguf_file"),
        ({"npu": {"memory": 3}}, "npu.memory", "mapping of keys (enable_mem_pool"),
    ],
)
def test_section_that_is_not_a_mapping(data, path, needle):
    assert needle in _issue(data, path).message


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        read_config({"model": {"temprature": 1, "max_tokens": 0}, "tools": {"retry_times": "2"}})
    assert sorted(i.path for i in info.value.issues) == [
        "model.max_tokens", "model.temprature", "tools.retry_times"]
    assert str(info.value).startswith("3 problems in the config:")


def test_not_a_mapping_dict_or_path():
    with pytest.raises(ConfigError, match="path to a YAML file or a dict, got list"):
        read_config([1, 2])  # type: ignore[arg-type]


def test_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found") as info:
        read_config(missing)
    assert info.value.issues[0].file == str(missing)
    assert str(missing) in str(info.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("npu:\n  device: cpu\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        read_config(bad)
    issue = info.value.issues[0]
    assert issue.file == str(bad) and issue.line is not None and issue.line >= 3
    assert f"{bad}:{issue.line}" in str(info.value)


def test_yaml_that_is_not_a_mapping(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- npu\n- model\n")
    with pytest.raises(ConfigError, match="must be a mapping of sections .* got list") as info:
        read_config(bad)
    assert info.value.issues[0].file == str(bad)


def test_yaml_error_names_file_and_line_of_the_key(tmp_path):
    cfg = tmp_path / "agent_config.yaml"
    cfg.write_text(
        "npu:\n"
        "  context:\n"
        "    device_id: 0\n"
        "  memory:\n"
        "    max_host_memry_mb: 4096\n"
        "tools:\n"
        "  timeout_ms: -5\n"
    )
    with pytest.raises(ConfigError) as info:
        read_config(cfg)
    by_path = {i.path: i for i in info.value.issues}
    assert by_path["npu.memory.max_host_memry_mb"].line == 5
    assert by_path["tools.timeout_ms"].line == 7
    assert all(i.file == str(cfg) for i in info.value.issues)
    text = str(info.value)
    assert f"{cfg}:5: npu.memory.max_host_memry_mb: unknown key" in text
    assert f"{cfg}:7: tools.timeout_ms: Input should be greater than 0" in text


def test_list_item_error_has_the_item_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("vectorstore:\n  texts:\n    - alpha\n    - 12\n")
    with pytest.raises(ConfigError) as info:
        read_config(cfg)
    assert (info.value.issues[0].path, info.value.issues[0].line) == ("vectorstore.texts[1]", 4)


def test_duplicate_yaml_key_is_an_error(tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text("tools:\n  timeout_ms: 100\n  timeout_ms: 200\n")
    with pytest.raises(ConfigError, match="given twice") as info:
        read_config(cfg)
    assert (info.value.issues[0].path, info.value.issues[0].line) == ("tools.timeout_ms", 3)


def test_empty_file_and_empty_sections_read_as_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert read_config(empty) == AgentConfig()
    cfg = tmp_path / "sections.yaml"
    cfg.write_text("npu:\n  context:\nmodel:\ntools:\n")
    config = read_config(cfg)
    assert config.npu.context.device_id is None
    assert config.model is not None and config.model.kv_cache_policy == "paged"
    assert config.tools is not None and config.tools.model_fields_set == set()


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "docs.txt").write_text("a\n")
    (tmp_path / "weights.gguf").write_text("")
    cfg = tmp_path / "kb" / "c.yaml"
    cfg.write_text("model:\n  path: ../weights.gguf\n"
                   "embeddings:\n  model: sentence-transformers/all-MiniLM-L6-v2\n"
                   "vectorstore:\n  texts_file: docs.txt\n")
    config = read_config(cfg)
    assert config.model is not None and config.vectorstore is not None
    assert Path(config.model.path or "").resolve() == (tmp_path / "weights.gguf").resolve()
    assert config.vectorstore.texts_file == str(tmp_path / "kb" / "docs.txt")
    assert config.embeddings is not None
    assert config.embeddings.model == "sentence-transformers/all-MiniLM-L6-v2"  # a hub id stays
    assert config.model.model_fields_set == {"path"}


def test_dict_config_paths_are_left_as_given():
    config = read_config({"vectorstore": {"texts_file": "docs.txt"}})
    assert config.vectorstore is not None and config.vectorstore.texts_file == "docs.txt"


def test_docs_reference_every_key():
    doc = (Path(__file__).parents[2] / "docs" / "config.md").read_text("utf-8")
    missing = [p for p in known_paths() if f"`{p}`" not in doc]
    assert not missing, f"docs/config.md does not document {missing}"
