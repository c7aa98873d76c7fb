"""AscendChatModel: a LangChain chat model served by langchain-ascend's own engine.

Thin on purpose: request preparation (messages -> prompt ids + sampling params) lives in
``chat.prepare``, reply assembly in ``chat.reply``, grammar selection in
``structured.selection``; the engine (``engine.engine.get_engine``) owns the model, the paged
KV cache and the batch. Importing this module imports no torch.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import fields
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from langchain_ascend.chat.batching import batch_configs
from langchain_ascend.chat.checks import check_sampling, stop_list
from langchain_ascend.chat.messages import to_template_tools, tool_names_of
from langchain_ascend.chat.prepare import (
    ChatSettings,
    PreparedRequest,
    chat_tokenizer,
    normalize_tool_choice,
    prepare_request,
    prompt_token_ids,
    tool_support_for,
)
from langchain_ascend.chat.results import chat_result, chunk_text, generation_chunk
from langchain_ascend.chat.template import load_chat_template
from langchain_ascend.chat.tool_support import ToolCallFormatSetting
from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.model_env import required_model_from_env
from langchain_ascend.structured.grammars import GrammarSpec
from langchain_ascend.structured.selection import grammar_backend, warm_up_specs
from langchain_ascend.validation import (
    check_count,
    check_device,
    check_dtype,
    check_flag,
    check_probability,
)

# Constructor arguments other chat models take that mean nothing for a local model; accepted
# (and ignored) so ``ChatOpenAI(...)``-style code keeps working.
_IGNORED_INIT_ARGS = frozenset(
    {"api_key", "base_url", "timeout", "max_retries", "organization", "request_timeout"}
)
_ALIASES = {"max_new_tokens": "max_tokens", "stop_sequences": "stop", "model_name": "model"}
_ENGINE_COUNTS = ("max_context_length", "block_size", "num_kv_blocks", "max_batch_size",
                  "max_num_batched_tokens")
_FLAGS = ("enable_prefix_caching", "parse_reasoning", "streaming")

class AscendChatModel(BaseChatModel):
    """Chat model running a Hugging Face decoder LM on langchain-ascend's engine.

    A drop-in for ``ChatHuggingFace`` / ``ChatOpenAI`` in chains, agents and langgraph graphs.
    The engine behind it keeps a paged KV cache with automatic prefix caching (system prompt,
    tool schemas and earlier turns of an agent are not recomputed on the next hop) and batches
    concurrent calls (``batch``/``abatch``, threads, asyncio tasks) continuously. Chat models on
    the same ``model``/``device``/``dtype`` share one engine in the process, whatever their
    sampling settings.

    Setup:
        ``pip install langchain-ascend`` (``[npu]`` extra plus CANN for Ascend). Weights load
        with ``AutoModelForCausalLM.from_pretrained(model)``: a local folder or a hub id.

    Key init args (sampling):
        model: Local path or hub id of a chat/instruct model (it needs a chat template).
        temperature: 0 = greedy; ``None`` = the model's ``generation_config.json`` default.
        max_tokens: Most tokens to generate; ``None`` = up to the context limit.
        top_p, top_k, seed, stop: As usual; ``seed`` makes sampling reproducible per call.

    Key init args (engine):
        device, dtype, max_context_length, block_size, num_kv_blocks,
        kv_cache_memory_fraction, enable_prefix_caching, max_batch_size.

    Models without a chat template:
        A base model, or a GGUF file without ``tokenizer.chat_template``, needs one:
        ``chat_template=`` takes the Jinja text or the path of a file holding it
        (``AscendChatModel(model="base.gguf", chat_template="chatml.jinja")``; in
        ``agent_config.yaml``: ``model.chat_template``). It replaces the tokenizer's own
        template for this chat model only; the reply also ends at the end-of-turn token the
        template writes (``<|im_end|>``, ``<|eot_id|>``...). Without any template a call raises
        ``ChatTemplateError`` naming ``chat_template=``.

    Instantiate:
        .. code-block:: python

            from langchain_ascend import AscendChatModel

            llm = AscendChatModel(model="/models/Qwen2.5-7B-Instruct", device="npu",
                                  temperature=0, max_tokens=512)

    Invoke / stream / batch:
        .. code-block:: python

            llm.invoke("What is the capital of France?").content
            # 'The capital of France is Paris.'
            for chunk in llm.stream("Count to three"):
                print(chunk.content, end="")
            llm.batch(["Hi", "Hello"])          # one continuous batch
            await llm.abatch(["Hi"] * 16)       # 16 requests, one batch, loop never blocked

    Tool calling:
        .. code-block:: python

            from langchain_core.tools import tool

            @tool
            def get_weather(city: str) -> str:
                \"\"\"Weather in a city.\"\"\"
                return "sunny"

            msg = llm.bind_tools([get_weather]).invoke("Weather in Paris?")
            msg.tool_calls
            # [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_…', 'type': 'tool_call'}]

        Calls are parsed from the model's own syntax (Hermes/Qwen ``<tool_call>``, Llama-3.1
        JSON / ``<|python_tag|>``, Mistral ``[TOOL_CALLS]``); a malformed call becomes an
        ``invalid_tool_calls`` entry, never an exception. ``tool_choice="required"``/``"any"``
        or a tool name is enforced by constrained decoding (xgrammar): every token follows
        the call syntax and the tool's schema, so a reply that ends on its own is exactly
        such call(s). Only ``max_tokens`` can cut it short: then ``finish_reason="length"``
        and an ``invalid_tool_calls`` entry whose error names the ``max_tokens`` limit.

    Structured output:
        .. code-block:: python

            from pydantic import BaseModel

            class Joke(BaseModel):
                setup: str
                punchline: str

            llm.with_structured_output(Joke).invoke("A joke about cats")
            # Joke(setup='…', punchline='…')

        ``method="json_schema"`` (default) and ``"function_calling"`` are grammar-constrained
        to the schema, ``"json_mode"`` to any JSON object; ``include_raw=True`` returns
        ``{"raw", "parsed", "parsing_error"}``.

    Reasoning models:
        ``<think>…</think>`` goes to ``additional_kwargs["reasoning_content"]``; pass template
        switches with ``chat_template_kwargs={"enable_thinking": False}``.

    Response metadata:
        ``usage_metadata`` has ``input_tokens``, ``output_tokens``, ``total_tokens`` and
        ``input_token_details["cache_read"]`` (prompt tokens served from the prefix cache);
        ``response_metadata`` has ``finish_reason`` (``stop``/``length``/``tool_calls``),
        ``model_name`` and ``timings`` (``queue``, ``time_to_first_token``, ``decode``,
        seconds).

    Per-call arguments:
        ``invoke(..., max_tokens=, temperature=, top_p=, top_k=, seed=, stop=,
        chat_template_kwargs=, model=)`` override the instance settings for one call
        (``model=`` switches to another model's shared engine). ``api_key``, ``base_url``,
        ``timeout`` and ``max_retries`` are accepted by the constructor for drop-in use and
        ignored; any other unknown argument is an error.

    Errors (all subclasses of ``langchain_ascend.errors.LangChainAscendError``):
        ``InvalidRequestError`` (empty conversation, a ``ToolMessage`` answering no call, bad
        ``tool_choice``...), ``UnsupportedContentError`` (image/audio/file blocks),
        ``PromptTooLongError``, ``ChatTemplateError`` (no chat template). The engine keeps
        serving other requests.
    """

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    model: str = Field(
        alias="model_name",
        default_factory=required_model_from_env,
    )
    """The chat model's weights and tokenizer: a local HF folder, a ``.gguf`` file or a folder
    of them (its blocks run as they are, or de-quantized once into the package cache: see
    ``quantization`` and ``langchain_ascend.engine.model_source``), or a hub id
    ``"org/name"`` found in the local Hugging Face cache; default ``$LANGCHAIN_ASCEND_MODEL``
    (``$LANGCHAIN_ASCEND_CHAT_MODEL``, deprecated, still read). Checked when the chat model is built
    (``ModelSourceError`` naming the path), loaded on the first call or ``warm_up()``."""

    gguf_file: str | None = None
    """Which GGUF file of a folder (or hub snapshot) holding several to load."""

    quantization: Literal["auto", "gguf", "int8", "int4", "none"] | None = "auto"
    """How the weights are held: ``"auto"`` (a ``.gguf`` model's own blocks, as ``"gguf"``;
    an HF folder's float weights), ``"gguf"`` (run the file's ``Q4_0`` / ``Q4_1`` / ``Q8_0``
    blocks as they are, no conversion; other block types re-quantized to the nearest, logged),
    ``"int8"`` / ``"int4"`` (every linear layer, LM head included, in 8-bit / 4-bit blocks of
    32, quantized at load, from a GGUF file or an HF folder), None or ``"none"`` (float; a
    GGUF file is de-quantized once into float32 in the package cache).
    ``engine.stats().weights`` reports the format and bytes."""

    device: str = "auto"
    """``"auto"`` (NPU, else CUDA, else CPU), ``"npu"``, ``"npu:1"``, ``"cuda"``, ``"cpu"``."""

    dtype: str = "auto"
    """``"auto"`` (bfloat16 on NPU/CUDA, float32 on CPU), or ``"bfloat16"``, ``"float16"``…"""

    max_tokens: int | None = Field(default=None, alias="max_new_tokens")
    """Most tokens to generate per call; ``None`` = until the context limit."""

    temperature: float | None = None
    """Sampling temperature; 0 = greedy; ``None`` = the model's generation config (greedy when
    it has none)."""

    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]; ``None`` = the generation config's, else 1."""

    top_k: int | None = None
    """Keep only the k most likely tokens; ``None`` = the generation config's, else off."""

    seed: int | None = None
    """Seed for sampling (temperature > 0): the same seed gives the same reply."""

    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Stop strings; the reply ends before the first one (not included)."""

    max_context_length: int | None = None
    """Most tokens (prompt + reply) per request; default the model's maximum."""

    block_size: int | None = None
    """Tokens per KV-cache block; default chosen by the attention backend (128 on Ascend)."""

    num_kv_blocks: int | None = None
    """KV-cache blocks to allocate; default: enough for ``max_batch_size`` requests of the full
    context, at most 256k tokens, and at most ``kv_cache_memory_fraction`` of free memory."""

    kv_cache_memory_fraction: float = 0.5
    """Share of free device memory given to the KV cache when ``num_kv_blocks`` is unset."""

    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes across calls (agent hops, sessions)."""

    max_batch_size: int = 64
    """Most requests decoded together in one engine step."""

    max_num_batched_tokens: int = 2048
    """Token budget of one engine step (long prompts are prefilled in chunks)."""

    compile: bool | Literal["auto"] = "auto"
    """Compile the decode step (``"auto"``: where the platform benefits)."""

    speculative_decoding: Literal["auto", "prompt_lookup", "off"] = "auto"
    """Several tokens per pass: greedy replies draft from their own context (prompt lookup),
    grammar replies jump over forced text; ``"auto"`` drafts where it pays and is exact
    (float32), see ``engine.core.speculation``. Per call too; ``response_metadata
    ["speculative"]`` reports it."""

    num_speculative_tokens: int = 8
    """Most drafted tokens per pass (0..16; the draft length adapts up to it); per call too."""

    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence tokens until ``max_tokens`` (for
    benchmarks that need a fixed reply length). Grammar-constrained replies still end with
    their grammar."""

    chat_template: str | Path | None = None
    """The chat template to render prompts with instead of the tokenizer's: the Jinja text
    (a string holding ``{%`` or ``{{``) or the path of a file holding it (``~`` expanded).
    For models without one (base models, GGUF files without ``tokenizer.chat_template``) or to
    replace it. Read and checked when the chat model is built (``ChatTemplateError`` naming
    ``chat_template=`` for a missing file or a broken template); applies to ``model`` (a
    per-call ``model=`` keeps that model's own template). The engine's tokenizer is not
    changed: chat models sharing an engine keep their own templates."""

    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for the chat template, e.g. ``{"enable_thinking": False}`` (Qwen3)."""

    tool_call_format: ToolCallFormatSetting = "auto"
    """Tool-call syntax to parse and to force. ``"auto"``: detected from the chat template; a
    template that does not render tools (e.g. SmolLM2's ChatML) gets the tool schemas written
    into its system turn in the Hermes ``<tool_call>`` fallback format (see
    ``langchain_ascend.chat.tool_format``). ``"fallback"``: that fallback even when the template
    renders tools. ``"hermes"``, ``"llama3_json"``, ``"mistral"``: that syntax (the last two need
    a template that renders tools; otherwise binding tools raises ``ChatTemplateError``)."""

    parse_reasoning: bool = True
    """Move ``<think>…</think>`` to ``additional_kwargs["reasoning_content"]``."""

    streaming: bool = False
    """Let ``invoke`` stream internally (callbacks get ``on_llm_new_token``)."""

    _engines: dict[str, Any] = PrivateAttr(default_factory=dict)
    _engines_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _chat_template_text: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _check_unknown_args(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        unknown = set(values) - known - _IGNORED_INIT_ARGS
        if unknown:
            raise InvalidRequestError(
                f"AscendChatModel got unknown argument(s) {sorted(unknown)}; see "
                "help(AscendChatModel) for the supported ones"
            )
        values = {k: v for k, v in values.items() if k not in _IGNORED_INIT_ARGS}
        # On the raw values, so a bool is refused before pydantic turns True into 1.
        raw = {_ALIASES.get(k, k): v for k, v in values.items()}
        check_sampling(raw)
        for name in _ENGINE_COUNTS:
            check_count(name, raw.get(name), allow_none=True)
        check_probability("kv_cache_memory_fraction", raw.get("kv_cache_memory_fraction"),
                          open_min=True, allow_none=True)
        for name in _FLAGS:
            check_flag(name, raw.get(name), allow_none=True)
        check_device(raw.get("device", "auto"))
        check_dtype(raw.get("dtype", "auto"))
        template = raw.get("chat_template")
        if template is not None and not isinstance(template, (str, os.PathLike)):
            load_chat_template(template)  # raises the typed error naming chat_template=
        for key in ("stop", "stop_sequences"):
            if key in values:
                values[key] = stop_list(values[key])
        return values

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Checked here (not in a validator) so the typed ModelSourceError reaches the caller
        # instead of being folded into pydantic's ValidationError.
        from langchain_ascend.engine.model_source import check_model_source

        check_model_source(self.model, gguf_file=self.gguf_file)
        self._chat_template_text = load_chat_template(self.chat_template)

    # ------------------------------------------------------------------ LangChain metadata

    @property
    def _llm_type(self) -> str:
        return "ascend-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "chat_template_kwargs": self.chat_template_kwargs,
            "chat_template": self._chat_template_text,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider="ascend",
            ls_model_name=model if isinstance(model, str) and model else self.model,
            ls_model_type="chat",
        )
        temperature = kwargs.get("temperature", self.temperature)
        if isinstance(temperature, (int, float)):
            params["ls_temperature"] = float(temperature)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if isinstance(max_tokens, int):
            params["ls_max_tokens"] = max_tokens
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    # ------------------------------------------------------------------ engine

    def _engine_for(self, model: str | None = None) -> Any:
        """The shared engine of ``model`` (default ``self.model``) on this device/dtype."""
        name = model or self.model
        with self._engines_lock:
            engine = self._engines.get(name)
            if engine is not None and not engine.is_closed:
                return engine
        from langchain_ascend.engine.registry import get_engine

        engine_kwargs: dict[str, Any] = {
            "enable_prefix_caching": self.enable_prefix_caching,
            "kv_cache_memory_fraction": self.kv_cache_memory_fraction,
            "max_batch_size": self.max_batch_size,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "compile": self.compile,
            "quantization": self.quantization,
        }
        for key, value in (
            ("max_context_length", self.max_context_length),
            ("block_size", self.block_size),
            ("num_blocks", self.num_kv_blocks),
        ):
            if value is not None:
                engine_kwargs[key] = value
        from langchain_ascend.engine.model_source import resolve_model_source

        # gguf_file= belongs to this chat model's own model; a per-call model= override is a
        # source of its own (a .gguf file, or a folder holding one GGUF file).
        source = resolve_model_source(
            name, gguf_file=self.gguf_file if name == self.model else None,
            quantization=self.quantization)
        engine = get_engine(source.path, device=self.device, dtype=self.dtype, **engine_kwargs)
        with self._engines_lock:
            self._engines[name] = engine
        return engine

    def get_engine(self) -> Any:
        """The shared engine of this chat model's ``model`` (loaded on first use): its
        ``stats()`` (KV blocks in use, running / waiting requests) for servers and tools."""
        return self._engine_for()

    def warm_up(
        self,
        *,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
        schemas: Sequence[dict[str, Any] | type] | None = None,
    ) -> None:
        """Load the model, allocate the KV cache, compile the decode step and the grammars,
        and run one tiny request, so the first real call is not the slow one.

        Args:
            tools: Tools whose forced-call grammar (``tool_choice="required"``) to pre-compile.
            schemas: Output schemas whose ``with_structured_output`` grammar to pre-compile.
        """
        from langchain_ascend.engine.core.sampling_params import SamplingParams

        engine = self._engine_for()
        engine.warmup()
        backend = self._grammar_backend(engine)
        for spec in self._warm_up_specs(engine, tools, schemas):
            backend.compile(spec)
        prompt = prompt_token_ids(
            chat_tokenizer(engine, self._settings(), self.model),
            [{"role": "user", "content": "Hi"}], None,
            self.chat_template_kwargs,
        )[0]
        engine.generate(prompt, SamplingParams(max_tokens=1))

    def _warm_up_specs(
        self, engine: Any, tools: Sequence[Any] | None, schemas: Sequence[Any] | None
    ) -> list[GrammarSpec]:
        """The grammars ``warm_up`` compiles: what ``json_mode``, ``tool_choice="required"``,
        each named tool, ``tool_choice="none"`` and ``with_structured_output(schema)`` ask for."""
        support = tool_support_for(engine, self._settings(), self.model)
        return warm_up_specs(
            to_template_tools(tools or ()),
            [convert_to_json_schema(s) for s in schemas or ()],
            fmt=support.fmt,
            special_tokens=set(special_tokens_of(engine.tokenizer)),
        )

    def _grammar_backend(self, engine: Any) -> Any:
        return grammar_backend(engine)

    def _settings(self) -> ChatSettings:
        values = {f.name: getattr(self, f.name) for f in fields(ChatSettings)
                  if f.name != "chat_template"}
        return ChatSettings(**values, chat_template=self._chat_template_text)

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> PreparedRequest:
        """Validate and render one call into engine inputs (raises typed errors)."""
        return prepare_request(messages, stop, kwargs, self._settings(), self._engine_for)

    # ------------------------------------------------------------------ generation

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Run every input at once, so the engine batches them all (``chat/batching``); a
        ``max_concurrency`` given in ``config`` is honoured."""
        if not inputs:
            return []
        return super().batch(inputs, batch_configs(config, len(inputs)),
                             return_exceptions=return_exceptions, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        output = prepared.engine.generate(prepared.prompt_token_ids, prepared.params)
        return chat_result(prepared, output)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prepared = await asyncio.to_thread(self._prepare, messages, stop, kwargs)
        output = await prepared.engine.agenerate(prepared.prompt_token_ids, prepared.params)
        return chat_result(prepared, output)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        prepared = self._prepare(messages, stop, kwargs)
        assembler = prepared.new_assembler()
        stream = prepared.engine.stream(prepared.prompt_token_ids, prepared.params)
        try:
            for delta in stream:
                chunk = generation_chunk(prepared, assembler, delta)
                if chunk is None:
                    continue
                if run_manager is not None:
                    run_manager.on_llm_new_token(chunk_text(chunk.message), chunk=chunk)
                yield chunk
        finally:
            stream.close()

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        prepared = await asyncio.to_thread(self._prepare, messages, stop, kwargs)
        assembler = prepared.new_assembler()
        stream = prepared.engine.astream(prepared.prompt_token_ids, prepared.params)
        try:
            async for delta in stream:
                chunk = generation_chunk(prepared, assembler, delta)
                if chunk is None:
                    continue
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk_text(chunk.message), chunk=chunk)
                yield chunk
        finally:
            await stream.aclose()

    # ------------------------------------------------------------------ tools / structure

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (LangChain tools, pydantic models, functions, OpenAI-format dicts).

        Args:
            tools: The tools; converted with ``convert_to_openai_tool``.
            tool_choice: ``None``/``"auto"`` (the model decides), ``"none"`` (tools stay in the
                prompt, the reply is text free of calls),
                ``"required"``/``"any"``/``True`` (at least one call), a tool name or
                ``{"type": "function", "function": {"name": ...}}`` (exactly that tool) —
                enforced by the grammar, complete unless ``max_tokens`` cuts the reply
                (``finish_reason="length"``, an ``invalid_tool_calls`` entry saying so).
            parallel_tool_calls: With a forced choice, allow several calls in one reply
                (default: yes for ``"required"``, no for a named tool).
            strict: Accepted for compatibility; forced calls always match the schema.
            **kwargs: Further call arguments to bind.

        Raises:
            InvalidRequestError: A tool that cannot be converted, or a ``tool_choice`` naming
                no bound tool.
        """
        formatted = to_template_tools(tools)
        choice = normalize_tool_choice(tool_choice, tool_names_of(formatted))
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, tool_choice=choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Return a runnable whose output matches ``schema``.

        Args:
            schema: A pydantic class (v2 or v1), a TypedDict, a JSON schema or an OpenAI tool
                dict.
            method: ``"json_schema"`` (grammar-constrained JSON matching the schema),
                ``"function_calling"`` (a grammar-forced call of a tool with that schema) or
                ``"json_mode"`` (any JSON object; describe the format in the prompt).
            include_raw: Return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``.
            strict: Accepted for compatibility; the constrained methods are always strict.

        Returns:
            A pydantic instance for a pydantic schema, else a dict.
        """
        if kwargs:
            raise InvalidRequestError(f"unsupported with_structured_output arguments {sorted(kwargs)}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        json_schema = convert_to_json_schema(schema)
        ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": json_schema}
        parser: Runnable
        if method == "function_calling":
            tool_name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools(
                [schema], tool_choice=tool_name, parallel_tool_calls=False,
                ls_structured_output_format=ls_format,
            )
            if is_pydantic:
                parser = PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
            else:
                parser = JsonOutputKeyToolsParser(key_name=tool_name, first_tool_only=True)
        elif method in ("json_schema", "json_mode"):
            if method == "json_schema":
                response_format = {
                    "type": "json_schema",
                    "json_schema": {"name": json_schema.get("title", "output"),
                                    "schema": json_schema},
                }
            else:
                response_format = {"type": "json_object"}
            llm = self.bind(response_format=response_format, ls_structured_output_format=ls_format)
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if is_pydantic
                else JsonOutputParser()
            )
        else:
            raise InvalidRequestError(
                f"unknown method {method!r}: use 'json_schema', 'function_calling' or 'json_mode'"
            )
        if not include_raw:
            return llm | parser
        parser_assign = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        parser_with_fallback = parser_assign.with_fallbacks(
            [parser_none], exception_key="parsing_error"
        )
        return RunnableMap(raw=llm) | parser_with_fallback

