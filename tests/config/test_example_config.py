"""The shipped examples/agent_config.yaml loads and builds what it says (tiny model swapped in
through $LANGCHAIN_ASCEND_MODEL, which the example's unset model.path falls back to)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from langchain_ascend.config import ConfigError, load_config, read_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "agent_config.yaml"


def test_example_validates_and_matches_the_file():
    data = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    config = read_config(EXAMPLE)
    assert config.model is not None and config.tools is not None and config.agent is not None
    assert config.model.max_context_length == data["model"]["max_context_length"]
    assert config.tools.timeout_ms == data["tools"]["timeout_ms"]
    assert config.agent.max_hops == data["agent"]["max_hops"]
    assert config.vectorstore is not None
    assert config.vectorstore.texts_file == str(EXAMPLE.parent / "agent_docs.txt")


@pytest.mark.parametrize(
    ("commented", "path"),
    [("# priority: high", "npu.context.priority"),
     ("# max_host_memory_mb: 4096", "npu.memory.max_host_memory_mb")],
)
def test_the_examples_rejected_keys_are_rejected(tmp_path, commented, path):
    text = EXAMPLE.read_text("utf-8")
    assert commented in text
    line = text[:text.index(commented)].count("\n") + 1
    cfg = tmp_path / "agent_config.yaml"
    cfg.write_text(text.replace(commented, commented.removeprefix("# ")))
    with pytest.raises(ConfigError, match="not supported") as info:
        read_config(cfg)
    assert [(i.path, i.line) for i in info.value.issues] == [(path, line)]


def test_example_builds_its_components(tiny_qwen2_path, monkeypatch):
    monkeypatch.setenv("LANGCHAIN_ASCEND_MODEL", str(tiny_qwen2_path))
    parts = load_config(EXAMPLE)
    assert parts.chat_model.model == str(tiny_qwen2_path)
    assert parts.chat_model.max_tokens == 256 and parts.chat_model.temperature == 0
    assert parts.tool_executor.timeout_ms == 5000 and parts.tool_executor.enable_parallel
    assert parts.embeddings.batch_size == 32
    lines = (EXAMPLE.parent / "agent_docs.txt").read_text("utf-8").splitlines()
    assert len(parts.vectorstore) == len(lines)
    hits = parts.retriever.invoke("paged block pool")
    assert len(hits) == 2 and hits[0].page_content == lines[0]


def test_example_builds_the_agent(tiny_qwen2_path, monkeypatch):
    pytest.importorskip("langchain_ascend.agent")
    from langchain_ascend.config import load_agent_config

    monkeypatch.setenv("LANGCHAIN_ASCEND_MODEL", str(tiny_qwen2_path))
    parts = load_agent_config(EXAMPLE)
    assert parts.agent.max_hops == 4
    assert parts.agent.system_prompt.startswith("You answer questions about langchain-ascend")
    assert sorted(parts.agent.executor.tools_by_name) == ["search_docs"]
