"""load_config builds real components from YAML and names what is wrong in a bad file."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from langchain_ascend.config import ConfigError, load_config, read_config


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text


def test_yaml_builds_every_component(tmp_path, tiny_qwen2_path):
    cfg = tmp_path / "agent_config.yaml"
    cfg.write_text(
        f"chat_model:\n  model: {tiny_qwen2_path}\n  device: cpu\n  max_tokens: 4\n"
        "embeddings:\n  device: cpu\n"
        "vectorstore:\n  texts: [alpha beta, gamma delta, NPUs are fast]\n  distance_strategy: COSINE\n"
        "tool_executor:\n  timeout_ms: 500\n  retry_times: 0\n"
    )
    built = load_config(cfg, tools=[echo])
    assert built.chat_model.max_tokens == 4
    reply = built.chat_model.invoke("hi")
    assert reply.usage_metadata["output_tokens"] <= 4
    docs = built.vectorstore.similarity_search("NPUs are fast", k=1)
    assert docs[0].page_content == "NPUs are fast"
    out = built.tool_executor.invoke([{"name": "echo", "args": {"text": "x"}, "id": "c1",
                                       "type": "tool_call"}])
    assert out[0].content == "x" and out[0].tool_call_id == "c1"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"chatmodel": {}}, "unknown config section"),
        ({"chat_model": ["x"]}, "must be a mapping"),
        ({"vectorstore": {"texts": ["a"], "path": "p"}}, "exactly one of"),
        ({"vectorstore": {"txts": ["a"]}}, "unknown vectorstore field"),
    ],
)
def test_bad_configs_name_the_problem(data, needle):
    with pytest.raises(ConfigError, match=needle):
        read_config(data)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("chat_model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_config(bad)


def test_unknown_chat_model_field_is_named(tiny_qwen2_path):
    with pytest.raises(ConfigError, match="temprature"):
        load_config({"chat_model": {"model": tiny_qwen2_path, "temprature": 0.1}})


def test_executor_section_needs_tools():
    with pytest.raises(ConfigError, match="tools="):
        load_config({"tool_executor": {"timeout_ms": 10}})
