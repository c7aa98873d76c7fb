"""Building the components a validated :class:`AgentConfig` describes.

Component classes (and torch, through them) are imported only when a section needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_ascend import platform
from langchain_ascend.agent import create_ascend_agent
from langchain_ascend.agent.retriever_tool import DEFAULT_NAME, retriever_tool
from langchain_ascend.chat.template import is_jinja
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.config.schema import (
    AgentConfig,
    EmbeddingsConfig,
    ModelConfig,
    NpuConfig,
    ToolsConfig,
    VectorStoreConfig,
)
from langchain_ascend.config.source import ConfigError, Source, read_raw, validate
from langchain_ascend.config.tool_imports import import_tools
from langchain_ascend.embeddings import AscendEmbeddings
from langchain_ascend.tools import NPUStreamToolExecutor
from langchain_ascend.vectorstores import AscendFAISS

# model-section keys that are not AscendChatModel fields of the same name.
_NOT_CHAT_FIELDS = {"path", "kv_cache_policy"}


@dataclass
class AgentComponents:
    """What :func:`load_agent_config` / :func:`load_config` built.

    Attributes:
        chat_model: The ``AscendChatModel``.
        embeddings: The ``AscendEmbeddings`` (None without ``embeddings``/``vectorstore``).
        vectorstore: The ``AscendFAISS`` store (None without ``vectorstore``).
        tool_executor: The ``NPUStreamToolExecutor`` running ``tools``.
        retriever: ``vectorstore.as_retriever(...)`` (None without ``vectorstore``).
        tools: The tools passed in, plus the retriever's tool with a ``vectorstore``: what
            the model is offered and the executor runs.
        agent: The ``create_ascend_agent`` runnable (``load_agent_config`` only).
        config: The validated config everything was built from.
    """

    chat_model: Any = None
    embeddings: Any = None
    vectorstore: Any = None
    tool_executor: Any = None
    retriever: Any = None
    tools: list[Any] = field(default_factory=list)
    agent: Any = None
    config: AgentConfig | None = None


def read_config(source: Source) -> AgentConfig:
    """Parse and validate a config file or dict (relative paths resolved against the
    file's folder); builds nothing.

    Raises:
        ConfigError: See :class:`~langchain_ascend.config.ConfigError`.
    """
    raw = read_raw(source)
    config = validate(raw)
    return _resolve_paths(config, raw.base_dir) if raw.base_dir is not None else config


def load_agent_config(source: Source, *,
                      tools: Sequence[Any] | None = None) -> AgentComponents:
    """Build the chat model, tool executor, embeddings, store, retriever and agent a config
    describes.

    Args:
        source: Path to a YAML file (``agent_config.yaml``), or an already parsed dict.
        tools: The agent's tools (tools are code, not config); the ``tools`` section sets
            how the executor runs them. With a ``vectorstore``, its retriever is one more
            tool (``vectorstore.tool_name``), run by the same executor.

    Returns:
        The built components, ``agent`` from
        ``langchain_ascend.agent.create_ascend_agent`` and the validated ``config``.

    Raises:
        ConfigError: The config is missing, malformed, or has unknown, misspelt,
            unsupported or badly valued keys; the message names each key's dotted path,
            the file and line, and what is allowed.
    """
    config = read_config(source)
    tools = [*import_tools(config.tools.imports if config.tools else None), *(tools or [])]
    out = _build(config, tools, chat_model=True, executor=True)

    options = config.agent.model_dump(exclude_unset=True) if config.agent is not None else {}
    out.agent = create_ascend_agent(out.chat_model, out.tools, executor=out.tool_executor,
                                    **options)
    return out


def load_config(source: Source, *, tools: Sequence[Any] | None = None) -> AgentComponents:
    """The components of the sections a config has, without the agent.

    Same file and validation as :func:`load_agent_config`; a section that is absent leaves
    its component None (``embeddings`` is built for a ``vectorstore`` too; the executor
    when there is a ``tools`` section or a tool: ``tools=`` or the vectorstore's).

    Raises:
        ConfigError: As :func:`load_agent_config`, and a ``tools`` section with no tool to
            run (no ``tools=[...]`` and no vectorstore).
    """
    config = read_config(source)
    tools = [*import_tools(config.tools.imports if config.tools else None), *(tools or [])]
    if config.tools is not None and not tools and config.vectorstore is None:
        raise ConfigError.one("the tools section has no tool to run: pass tools=[...] in code",
                              path="tools")
    return _build(config, tools, chat_model=config.model is not None,
                  executor=True if config.tools is not None else None)


def _build(config: AgentConfig, tools: Sequence[Any] | None, *, chat_model: bool,
           executor: bool | None) -> AgentComponents:
    """The components; ``executor=None`` builds the executor only when there is a tool."""
    out = AgentComponents(config=config, tools=list(tools or []))
    device = config_device(config.npu)
    if chat_model:
        out.chat_model = build_chat_model(config.model or ModelConfig(), device)
    if config.embeddings is not None or config.vectorstore is not None:
        out.embeddings = build_embeddings(config.embeddings or EmbeddingsConfig(), device)
    store = config.vectorstore
    if store is not None:
        out.vectorstore = build_vectorstore(store, out.embeddings, device)
        out.retriever = out.vectorstore.as_retriever(
            **({"search_kwargs": {"k": store.k}} if store.k is not None else {}))
        out.tools.append(retriever_tool(out.retriever, name=store.tool_name or DEFAULT_NAME,
                                        description=store.tool_description))
    if executor or (executor is None and out.tools):
        out.tool_executor = build_executor(config.tools or ToolsConfig(), config.npu, device,
                                           out.tools)
    return out


def config_device(npu: NpuConfig) -> str:
    """The device string of ``npu.device`` + ``npu.context.device_id``.

    ``npu``/``cuda`` with an index give ``npu:N``/``cuda:N``; ``auto`` with an index looks
    for an NPU, then CUDA (``platform``), and gives that kind with the index, or ``cpu``.
    """
    index = npu.context.device_id
    if index is None or npu.device == "cpu":
        return npu.device
    if npu.device in ("npu", "cuda"):
        return f"{npu.device}:{index}"

    if platform.probe_npu().available:
        return f"npu:{index}"
    if not platform.cuda_reason():
        return f"cuda:{index}"
    return "cpu"


def build_chat_model(model: ModelConfig, device: str) -> Any:
    """``AscendChatModel`` from the ``model`` keys the file set, on ``device``."""
    fields = {k: v for k, v in model.model_dump(exclude_unset=True).items()
              if k not in _NOT_CHAT_FIELDS}
    if model.path is not None:
        fields["model"] = model.path
    return AscendChatModel(device=device, **fields)


def build_embeddings(section: EmbeddingsConfig, device: str) -> Any:
    """``AscendEmbeddings`` on ``embeddings.device``, else the config's device."""
    fields = section.model_dump(exclude_unset=True)
    fields["device"] = section.device or device
    return AscendEmbeddings(**fields)


def build_vectorstore(section: VectorStoreConfig, embeddings: Any, device: str) -> Any:
    """``AscendFAISS.load_local(path)`` or ``from_texts(texts | lines of texts_file)``."""
    options: dict[str, Any] = {"device": device}
    if section.distance_strategy is not None:
        options["distance_strategy"] = section.distance_strategy
    if section.normalize_L2 is not None:
        options["normalize_L2"] = section.normalize_L2
    if section.path is not None:
        if not Path(section.path).is_dir():
            raise ConfigError.one(f"no saved index folder at {section.path}",
                                  path="vectorstore.path")
        return AscendFAISS.load_local(
            section.path, embeddings,
            allow_dangerous_deserialization=section.allow_dangerous_deserialization, **options)
    if section.texts_file is not None:
        path = Path(section.texts_file)
        if not path.is_file():
            raise ConfigError.one(f"file not found: {path}", path="vectorstore.texts_file")
        texts = [line.strip() for line in path.read_text("utf-8").splitlines() if line.strip()]
        if not texts:
            raise ConfigError.one(f"{path} holds no text", path="vectorstore.texts_file")
    else:
        texts = list(section.texts or [])
    return AscendFAISS.from_texts(texts, embeddings, **options)


def build_executor(section: ToolsConfig, npu: NpuConfig, device: str,
                   tools: Sequence[Any] | None) -> Any:
    """``NPUStreamToolExecutor(tools)`` with the ``tools`` keys the file set; device streams
    on the config's device unless ``npu.stream.enable_async`` is false (``device=None``)."""
    fields = section.model_dump(exclude_unset=True)
    fields.pop("imports", None)  # the tools themselves, not an executor option
    return NPUStreamToolExecutor(list(tools or []),
                                 device=device if npu.stream.enable_async else None, **fields)


def _resolve_paths(config: AgentConfig, base: Path) -> AgentConfig:
    """Relative file paths resolved against the config file's folder. ``model.path``,
    ``model.chat_template`` and ``embeddings.model`` only when that file exists (they may be
    hub ids, or the template text itself)."""
    updates: dict[str, Any] = {}
    if config.model is not None:
        moved = {k: found for k in ("path", "chat_template")
                 if (found := _existing_file_key(base, config.model, k)) is not None}
        if moved:
            updates["model"] = config.model.model_copy(update=moved)
    if config.embeddings is not None and config.embeddings.model is not None:
        found = _existing(base, config.embeddings.model)
        if found is not None:
            updates["embeddings"] = config.embeddings.model_copy(update={"model": found})
    store = config.vectorstore
    if store is not None:
        moved = {k: str(base / Path(v).expanduser()) for k in ("path", "texts_file")
                 if (v := getattr(store, k)) is not None}
        if moved:
            updates["vectorstore"] = store.model_copy(update=moved)
    return config.model_copy(update=updates) if updates else config


def _existing_file_key(base: Path, section: Any, key: str) -> str | None:
    """``section.key`` resolved against ``base`` when it names an existing relative file; a
    chat template given as Jinja text is left as it is."""
    value = getattr(section, key)
    if value is None or (key == "chat_template" and is_jinja(value)):
        return None
    return _existing(base, value)


def _existing(base: Path, value: str) -> str | None:
    path = Path(value).expanduser()
    if path.is_absolute():
        return None
    candidate = base / path
    return str(candidate) if candidate.exists() else None
