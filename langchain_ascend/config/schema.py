"""The ``agent_config.yaml`` schema as pydantic models; every section forbids unknown keys.

Each accepted key changes something real in a built component (see ``docs/config.md`` and
``build.py``). Keys the article's schema has that no API can honour are declared with
:func:`_refused` so that they are rejected with the reason instead of reported as unknown;
values the engine cannot honour (``kv_cache_policy`` other than ``paged``,
``enable_mem_pool: false``) are rejected by validators that say why.

Importing this module imports neither torch nor the components.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from langchain_ascend.chat_models import AscendChatModel

Device = Literal["auto", "npu", "cuda", "cpu"]
IMPORT_PATH = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[:.][A-Za-z_]\w*$"
"""A tool's import path (``tools.imports``): a dotted module path, then ``:name`` or ``.name``."""
SpeculativeMode = Literal["auto", "prompt_lookup", "off"]


class Refusal:
    """A before-validator that rejects any value given for a key we cannot honour."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __call__(self, value: Any) -> Any:
        raise ValueError(f"not supported: {self.reason}")


def _refused(reason: str) -> Any:
    """Annotation metadata for a key that is recognised but always rejected with ``reason``."""
    return BeforeValidator(Refusal(reason))


def _path_text(value: Any) -> Any:
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    if value == "":
        raise ValueError("must not be empty")
    return value


#: A path or model id; ``pathlib.Path`` values are accepted in dict configs.
PathText = Annotated[str, BeforeValidator(_path_text)]

_NO_PRIORITY = (
    "torch_npu has no per-agent ACL context (no create_context/set_context, no context "
    "priority); a process uses one device per component, chosen with npu.context.device_id, "
    "and the tool executor's device streams")
_NO_HOST_MEMORY_CAP = (
    "no component of langchain-ascend can bound the host memory it uses; the KV cache pool "
    "is bounded with model.num_kv_blocks or model.kv_cache_memory_fraction (of free device "
    "memory, host RAM on CPU)")
_NO_SYNC_MODE = (
    "torch_npu exposes no stream sync-mode switch (aclrtSetStreamSyncMode); for debugging set "
    "ASCEND_LAUNCH_BLOCKING=1 in the environment")


def section_class(annotation: Any) -> type[Section] | None:
    """The :class:`Section` subclass a field holds (``X | None`` unwrapped), else None."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = section_class(arg)
        if found is not None:
            return found
    return None


class Section(BaseModel):
    """Base of every section: unknown keys are errors, no lax type coercion, and an empty
    sub-section (``context:`` with nothing under it) reads as its defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_subsections(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        sections = {name for name, f in cls.model_fields.items()
                    if section_class(f.annotation) is not None}
        return {k: ({} if v is None and k in sections else v) for k, v in data.items()}


class NpuContext(Section):
    """``npu.context``: which device."""

    device_id: int | None = Field(default=None, ge=0)
    """Device index: ``npu.device`` ``npu``/``cuda`` becomes ``npu:N``/``cuda:N``; with
    ``auto`` the index goes to whichever accelerator ``auto`` finds (none on CPU, where the
    index is ignored)."""

    priority: Annotated[Any, _refused(_NO_PRIORITY)] = None


class NpuStream(Section):
    """``npu.stream``: device streams of the tool executor."""

    enable_async: bool = True
    """Run each sync tool call on its own device stream (the executor's ``device``); false
    gives the executor ``device=None``: no streams, torch never imported by it."""

    sync_mode: Annotated[Any, _refused(_NO_SYNC_MODE)] = None


class NpuMemory(Section):
    """``npu.memory``: the KV cache pool."""

    enable_mem_pool: bool = True
    """The engine always keeps its KV cache in one preallocated paged block pool; only
    ``true`` (what it does) is accepted."""

    max_host_memory_mb: Annotated[Any, _refused(_NO_HOST_MEMORY_CAP)] = None

    @field_validator("enable_mem_pool")
    @classmethod
    def _pool_only(cls, value: bool) -> bool:
        if value is not True:
            raise ValueError(
                "not supported: the engine has no unpooled KV cache; its paged block pool is "
                "always on (size it with model.num_kv_blocks / model.kv_cache_memory_fraction)")
        return value


class NpuConfig(Section):
    """``npu``: the device every component uses (``embeddings.device`` may override)."""

    device: Device = "auto"
    """``auto`` (NPU, else CUDA, else CPU), ``npu``, ``cuda`` or ``cpu``."""

    context: NpuContext = Field(default_factory=NpuContext)
    stream: NpuStream = Field(default_factory=NpuStream)
    memory: NpuMemory = Field(default_factory=NpuMemory)

    @model_validator(mode="after")
    def _cpu_has_no_index(self) -> NpuConfig:
        if self.device == "cpu" and self.context.device_id not in (None, 0):
            raise ValueError(
                f"npu.device is 'cpu', which has no device index; npu.context.device_id "
                f"{self.context.device_id} is meaningless (remove it or pick npu/cuda/auto)")
        return self


def _chat_model_fields() -> dict[str, Any]:
    return dict(AscendChatModel.model_fields)


class ModelConfig(Section):
    """``model``: the chat model (``AscendChatModel``) and its engine."""

    path: PathText | None = None
    """``AscendChatModel.model``: a HF folder, a ``.gguf`` file or folder, or a hub id in the
    local HF cache; default ``$LANGCHAIN_ASCEND_MODEL``."""

    gguf_file: str | None = None
    chat_template: PathText | None = None
    """``AscendChatModel.chat_template``: the Jinja chat template (a string holding ``{%`` or
    ``{{``) or the path of a file holding one (relative to the config file's folder), for a
    model without one (a base model, a GGUF file without ``tokenizer.chat_template``)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    quantization: Literal["auto", "gguf", "int8", "int4", "none"] | None = None
    """``AscendChatModel.quantization``: ``auto`` (a .gguf file's own blocks), ``gguf``,
    ``int8``, ``int4``, ``none`` (float); unset: ``auto``."""
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """``AscendChatModel.kv_cache_dtype``; unset: ``auto``."""
    kv_cache_policy: str = "paged"
    max_context_length: int | None = Field(default=None, ge=1)
    block_size: int | None = Field(default=None, ge=1)
    num_kv_blocks: int | None = Field(default=None, ge=1)
    kv_cache_memory_fraction: float | None = Field(default=None, gt=0, le=1)
    enable_prefix_caching: bool | None = None
    max_batch_size: int | None = Field(default=None, ge=1)
    compile: bool | Literal["auto"] | None = None
    speculative_decoding: SpeculativeMode | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    budget_closed_output: Literal["cut", "complete"] | None = None
    """``AscendChatModel.budget_closed_output``: a forced call or structured output the budget
    guard closed early counts as cut (``cut``, the default) or as complete."""

    @field_validator("kv_cache_policy")
    @classmethod
    def _paged_only(cls, value: str) -> str:
        if value != "paged":
            raise ValueError(
                f"not supported: kv_cache_policy {value!r}; the engine's KV cache is paged "
                "(blocks of model.block_size tokens with prefix caching), the only policy; "
                "allowed: 'paged'")
        return value

    @field_validator("speculative_decoding", "num_speculative_tokens")
    @classmethod
    def _engine_has_it(cls, value: Any, info: Any) -> Any:
        if value is not None and info.field_name not in _chat_model_fields():
            raise ValueError(
                f"not supported by this version of langchain-ascend: AscendChatModel has no "
                f"{info.field_name!r} field yet")
        return value


class ToolsConfig(Section):
    """``tools``: ``NPUStreamToolExecutor`` options, and the tools themselves by import path
    (``imports``) or in code (``tools=[...]``)."""

    timeout_ms: float | None = Field(default=None, gt=0)
    retry_times: int | None = Field(default=None, ge=0)
    enable_parallel: bool | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    retry_on_timeout: bool | None = None
    retry_backoff_ms: float | None = Field(default=None, ge=0)
    imports: list[Annotated[str, Field(pattern=IMPORT_PATH)]] | None = Field(
        default=None, min_length=1)
    """The agent's tools as ``"package.module:name"`` (a LangChain tool, a function or a
    list of them), imported when the agent is built (``config.tool_imports``); added before
    the tools passed in code. ``langchain-ascend serve --config`` has no other way to get
    tools."""


class EmbeddingsConfig(Section):
    """``embeddings``: ``AscendEmbeddings``."""

    model: PathText | None = None
    device: str | None = None
    batch_size: int | None = Field(default=None, ge=1)

    @field_validator("device")
    @classmethod
    def _device_spelling(cls, value: str | None) -> str | None:
        if value is None:
            return value
        kind, _, index = value.lower().partition(":")
        if kind not in ("auto", "npu", "cuda", "cpu") or (index and not index.isdigit()):
            raise ValueError(f"unknown device {value!r}; allowed: auto, npu[:N], cuda[:N], cpu")
        return value


class VectorStoreConfig(Section):
    """``vectorstore``: ``AscendFAISS``, loaded from a saved folder or indexed from texts."""

    path: PathText | None = None
    texts: list[str] | None = Field(default=None, min_length=1)
    texts_file: PathText | None = None
    distance_strategy: Literal["EUCLIDEAN_DISTANCE", "MAX_INNER_PRODUCT", "DOT_PRODUCT",
                               "COSINE"] | None = None
    normalize_L2: bool | None = None
    allow_dangerous_deserialization: bool = False
    k: int | None = Field(default=None, ge=1)
    tool_name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    tool_description: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> VectorStoreConfig:
        given = [k for k in ("path", "texts", "texts_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "needs exactly one of 'path' (a saved index folder), 'texts' (a list) or "
                f"'texts_file' (one text per line); got {given or 'none'}")
        return self


class AgentSection(Section):
    """``agent``: ``create_ascend_agent`` options."""

    max_hops: int = Field(default=8, ge=1)
    system_prompt: str | None = None
    first_hop_tool_choice: str | None = Field(default=None, min_length=1)
    final_hop_tool_choice: str | None = Field(default=None, min_length=1)


class AgentConfig(Section):
    """The whole file. Absent sections: ``load_config`` leaves their component None;
    ``load_agent_config`` builds the chat model, executor and agent with defaults."""

    npu: NpuConfig = Field(default_factory=NpuConfig)
    model: ModelConfig | None = None
    tools: ToolsConfig | None = None
    embeddings: EmbeddingsConfig | None = None
    vectorstore: VectorStoreConfig | None = None
    agent: AgentSection | None = None


def refusal_of(cls: type[Section], key: str) -> str | None:
    """The reason a recognised-but-refused key is rejected, or None for a normal key."""
    field = cls.model_fields.get(key)
    for meta in field.metadata if field is not None else ():
        if isinstance(meta, BeforeValidator) and isinstance(meta.func, Refusal):
            return meta.func.reason
    return None


def known_paths(cls: type[Section] = AgentConfig, prefix: str = "") -> list[str]:
    """Every dotted key path the schema knows (refused keys included), leaves only."""
    paths: list[str] = []
    for name, field in cls.model_fields.items():
        sub = section_class(field.annotation)
        path = f"{prefix}{name}"
        paths.extend(known_paths(sub, path + ".") if sub is not None else [path])
    return paths
