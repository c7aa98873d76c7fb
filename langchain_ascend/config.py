"""Build the package's components from one YAML (or dict) config.

Example ``agent_config.yaml``::

    chat_model:            # AscendChatModel fields
      model: /models/Qwen2.5-7B-Instruct
      device: auto
      max_tokens: 256
    embeddings:            # AscendEmbeddings fields (omit ``model`` for the bundled MiniLM)
      device: auto
    vectorstore:           # AscendFAISS: load a saved folder, or index texts
      path: ./kb_index     # or: texts: [..] / texts_file: docs.txt (one text per line)
      distance_strategy: COSINE
    tool_executor:         # NPUStreamToolExecutor options (tools are passed in code)
      timeout_ms: 5000
      retry_times: 1

Every section is optional. Unknown sections or fields raise :class:`ConfigError` naming them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_ascend.errors import LangChainAscendError

_SECTIONS = ("chat_model", "embeddings", "vectorstore", "tool_executor")
_VECTORSTORE_KEYS = {"path", "texts", "texts_file", "distance_strategy", "normalize_L2",
                     "allow_dangerous_deserialization"}


class ConfigError(LangChainAscendError, ValueError):
    """The config file is missing, malformed, or names an unknown section or field."""


@dataclass
class AgentComponents:
    """What :func:`load_config` built; sections absent from the config are None."""

    chat_model: Any = None
    embeddings: Any = None
    vectorstore: Any = None
    tool_executor: Any = None


def read_config(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """Parse and validate a config file or dict; returns the validated mapping."""
    if isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        import yaml

        try:
            data = yaml.safe_load(path.read_text("utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config section(s) {unknown}; known: {list(_SECTIONS)}")
    for name in _SECTIONS:
        section = data.get(name)
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"section {name!r} must be a mapping, got {type(section).__name__}")
    vs = data.get("vectorstore") or {}
    bad = sorted(set(vs) - _VECTORSTORE_KEYS)
    if bad:
        raise ConfigError(f"unknown vectorstore field(s) {bad}; known: {sorted(_VECTORSTORE_KEYS)}")
    if vs and sum(k in vs for k in ("path", "texts", "texts_file")) != 1:
        raise ConfigError("vectorstore needs exactly one of 'path', 'texts' or 'texts_file'")
    return data


def _construct(cls: type, fields: dict[str, Any], section: str) -> Any:
    model_fields: dict[str, Any] = getattr(cls, "model_fields", {})
    known = set(model_fields) or None
    if known is not None:
        aliases = {f.alias for f in model_fields.values() if f.alias}
        bad = sorted(set(fields) - known - aliases)
        if bad:
            raise ConfigError(f"unknown {section} field(s) {bad}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ConfigError(f"bad {section} fields: {exc}") from exc


def load_config(source: str | os.PathLike[str] | dict[str, Any], *,
                tools: list[Any] | None = None) -> AgentComponents:
    """Build the components a config describes.

    Args:
        source: Path to a YAML file, or an already parsed dict.
        tools: Tools for the ``tool_executor`` section (tools are code, not config).

    Returns:
        The built components; missing sections stay None.

    Raises:
        ConfigError: The config is malformed or names unknown sections/fields.
    """
    data = read_config(source)
    out = AgentComponents()
    if data.get("chat_model") is not None:
        from langchain_ascend.chat_models import AscendChatModel

        out.chat_model = _construct(AscendChatModel, dict(data["chat_model"]), "chat_model")
    needs_embeddings = data.get("embeddings") is not None or data.get("vectorstore") is not None
    if needs_embeddings:
        from langchain_ascend.embeddings import AscendEmbeddings

        out.embeddings = _construct(AscendEmbeddings, dict(data.get("embeddings") or {}), "embeddings")
    if data.get("vectorstore") is not None:
        out.vectorstore = _build_vectorstore(dict(data["vectorstore"]), out.embeddings)
    if data.get("tool_executor") is not None:
        from langchain_ascend.tools import NPUStreamToolExecutor

        if not tools:
            raise ConfigError("the tool_executor section needs tools=[...] passed to load_config")
        try:
            out.tool_executor = NPUStreamToolExecutor(tools, **data["tool_executor"])
        except TypeError as exc:
            raise ConfigError(f"bad tool_executor fields: {exc}") from exc
    return out


def _build_vectorstore(section: dict[str, Any], embeddings: Any) -> Any:
    from langchain_ascend.vectorstores import AscendFAISS

    options = {k: section[k] for k in ("distance_strategy", "normalize_L2") if k in section}
    if "path" in section:
        return AscendFAISS.load_local(
            section["path"], embeddings,
            allow_dangerous_deserialization=bool(section.get("allow_dangerous_deserialization")),
        )
    if "texts_file" in section:
        path = Path(section["texts_file"])
        if not path.is_file():
            raise ConfigError(f"vectorstore texts_file not found: {path}")
        texts = [line.strip() for line in path.read_text("utf-8").splitlines() if line.strip()]
    else:
        texts = list(section["texts"])
    return AscendFAISS.from_texts(texts, embeddings, **options)
