"""AscendChatModel: a LangChain chat model served by langchain-ascend's own engine.

Thin on purpose: request preparation (messages -> prompt ids + sampling params) lives in
``chat.prepare``, reply assembly in ``chat.reply``, grammar selection in
``structured.selection``; the engine (``engine.shared_engines.get_engine``) owns the model,
the paged KV cache and the batch. Importing this module imports no torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from langchain_ascend.chat.arguments import normalize_init_args
from langchain_ascend.chat.batching import batch_configs
from langchain_ascend.chat.engines import EngineHandles, load_tokenizer, pin
from langchain_ascend.chat.fields import EngineFields, SamplingFields
from langchain_ascend.chat.hop_sessions import SessionFields, open_hop
from langchain_ascend.chat.messages import to_template_tools, tool_names_of
from langchain_ascend.chat.metadata import identifying_params, ls_params
from langchain_ascend.chat.prepare import (
    ChatSettings,
    PreparedRequest,
    normalize_tool_choice,
    prepare_request,
)
from langchain_ascend.chat.profile import profile_for
from langchain_ascend.chat.results import chat_result, chunk_text, generation_chunk
from langchain_ascend.chat.structured_output import structured_output
from langchain_ascend.chat.template import load_chat_template
from langchain_ascend.chat.token_count import count_prompt_tokens, text_token_ids
from langchain_ascend.chat.tool_support import ToolCallFormatSetting
from langchain_ascend.chat.warm_up import warm_up_engine
from langchain_ascend.engine.model_source import check_model_source
from langchain_ascend.model_env import required_model_from_env


class AscendChatModel(BaseChatModel, EngineFields, SamplingFields, SessionFields):
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

    Key init args (sampling; ``chat.fields.SamplingFields``):
        model: Local path or hub id of a chat/instruct model (it needs a chat template);
            also ``model_path=``, ``model_id=``, ``model_name=``.
        temperature: 0 = greedy; ``None`` = the model's ``generation_config.json`` default.
        max_tokens: Most tokens to generate; ``None`` = up to the context limit.
        top_p, top_k, min_p, seed, stop: As usual; ``seed`` makes sampling reproducible.
        repetition_penalty: Hugging Face's (``None``: the generation config's, as ``generate``
            applies it); ``presence_penalty`` / ``frequency_penalty``: OpenAI's, in [-2, 2].

    Key init args (engine; ``chat.fields.EngineFields``):
        device, dtype, max_context_length (also ``n_ctx=``, ``max_model_len=``), block_size,
        num_kv_blocks, kv_cache_memory_fraction, enable_prefix_caching, max_batch_size,
        model_kwargs (``{"revision": ...}`` for a hub id).

        .. code-block:: python

            llm = AscendChatModel(model_path="/models/SmolLM2.gguf", n_ctx=4096,
                                  repetition_penalty=1.1)

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
        ``<think>…</think>`` goes to ``additional_kwargs["reasoning_content"]``;
        ``reasoning=False`` / ``True`` switches thinking off / on (the template's
        ``enable_thinking``), ``"low"``/``"medium"``/``"high"`` also sets ``reasoning_effort``;
        other template switches go in ``chat_template_kwargs``.

    Token counting and profile:
        ``get_num_tokens_from_messages(messages, tools=...)`` renders the conversation with
        the model's own chat template and tokenizer, as a call does: it equals that call's
        ``usage_metadata["input_tokens"]``, offline (``trim_messages(token_counter=llm)``
        works). ``llm.profile`` holds ``max_input_tokens`` (the context the engine allows),
        ``tool_calling``, ``structured_output``, ``reasoning_output``...

    Response metadata:
        ``usage_metadata`` has ``input_tokens``, ``output_tokens``, ``total_tokens`` and
        ``input_token_details["cache_read"]`` (prompt tokens served from the prefix cache);
        ``response_metadata`` has ``finish_reason`` (``stop``/``length``/``tool_calls``),
        ``model_name`` (the hub id, config name or GGUF ``general.name``, not a path),
        ``model_provider`` (``"ascend"``) and ``timings`` (``queue``, ``time_to_first_token``, ``decode``,
        seconds).

    Per-call arguments:
        ``invoke(..., max_tokens=, temperature=, top_p=, top_k=, min_p=, seed=, stop=,
        repetition_penalty=, presence_penalty=, frequency_penalty=, reasoning=,
        stream_usage=, chat_template_kwargs=, model=)`` override the instance settings for
        one call (``model=`` switches to another model's shared engine). Arguments of remote
        chat models (``api_key``, ``base_url``, ``timeout``, ``max_retries``...) are accepted
        by the constructor with a warning that they have no effect; any other unknown
        argument is an error (``chat.arguments``).

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

    reasoning: bool | Literal["low", "medium", "high"] | None = None
    """Thinking on (True) or off (False) through the template's ``enable_thinking``; an effort
    level also sets ``reasoning_effort``; None: the template's default. Per call too."""

    streaming: bool = False
    """Let ``invoke`` stream internally (callbacks get ``on_llm_new_token``)."""

    stream_usage: bool = True
    """Whether the last streamed chunk carries ``usage_metadata``; per call too."""

    _engines: EngineHandles = PrivateAttr(default_factory=EngineHandles)
    _chat_template_text: str | None = PrivateAttr(default=None)
    _tokenizers: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _check_unknown_args(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        return normalize_init_args(values, cls.model_fields)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Checked here (not in a validator) so the typed ModelSourceError reaches the caller
        # instead of being folded into pydantic's ValidationError.
        check_model_source(self.model, gguf_file=self.gguf_file)
        self._chat_template_text = load_chat_template(self.chat_template)

    # ------------------------------------------------------------------ LangChain metadata

    @property
    def _llm_type(self) -> str:
        return "ascend-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return identifying_params(self, self._chat_template_text)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return ls_params(self, stop, kwargs)

    # ------------------------------------------------------------------ engine

    def __copy__(self) -> AscendChatModel:
        """A copy (``model_copy``) holds its engines itself: the original's go when it does."""
        copied = super().__copy__()
        copied._engines = EngineHandles()
        return copied

    def _engine_for(self, model: str | None = None) -> Any:
        """The shared engine of ``model`` (default ``self.model``) with this chat model's
        device, dtype and engine settings; it lives while a chat model holds it."""
        return self._engines.engine(self, model or self.model)

    def _tokenizer_for(self, model: str) -> Any:
        """What holds ``model``'s tokenizer for counting: its engine when loaded, else the
        tokenizer alone (no weights are loaded to count tokens)."""
        engine = self._engines.loaded(self, model)
        if engine is not None:
            return engine
        with self._engines.lock:
            holder = self._tokenizers.get(model)
        if holder is None:
            holder = load_tokenizer(self, model)
            with self._engines.lock:
                self._tokenizers[model] = holder
        return holder

    def get_engine(self) -> Any:
        """The shared engine of this chat model's ``model`` (loaded on first use): its
        ``stats()`` (KV blocks in use, running / waiting requests) for servers and tools.
        An engine handed out here stays until its ``shutdown()``, past this chat model."""
        engine = self._engine_for()
        pin(engine)
        return engine

    def warm_up(
        self,
        *,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
        schemas: Sequence[dict[str, Any] | type] | None = None,
        calls: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Load the model, allocate the KV cache, compile the decode step and the grammars,
        and run one tiny request, so the first real call is not the slow one
        (``chat.warm_up``).

        Args:
            tools: Tools whose forced-call grammars (``tool_choice`` ``"none"``,
                ``"required"``, each name) to pre-compile.
            schemas: Output schemas whose ``with_structured_output`` grammar to pre-compile.
            calls: Call arguments as bindings hold them (``bind_tools(...).kwargs``): the
                grammar each such call asks for, exactly, is pre-compiled.
        """
        warm_up_engine(self._engine_for(), self._settings(), tools, schemas, calls=calls,
                       engine_for=self._engine_for)

    # ------------------------------------------------------------------ tokens / profile

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` in the model's own vocabulary (as prompts are tokenized)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return text_token_ids(self._tokenizer_for(self.model).tokenizer, text)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage],
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
        **kwargs: Any,
    ) -> int:
        """Prompt tokens of a call with ``messages`` and ``tools``: the model's chat template
        and tokenizer, as the call renders them (``chat.token_count``), so the count equals its
        ``usage_metadata["input_tokens"]``. Pass the tools here: ``llm.bind_tools(...)`` hands
        this method none (LangChain's bindings forward only ``config``, as for every chat model).
        ``kwargs``: further call arguments (``tool_choice``, ``chat_template_kwargs``,
        ``reasoning``...). Messages as ``invoke`` takes them. Works offline."""
        if tools:
            kwargs["tools"] = to_template_tools(tools)
        return count_prompt_tokens(messages, kwargs, self._settings(), self._tokenizer_for)

    def _resolve_model_profile(self) -> ModelProfile | None:
        return profile_for(self, load_chat_template(self.chat_template))

    def _settings(self) -> ChatSettings:
        values = {f.name: getattr(self, f.name) for f in fields(ChatSettings)
                  if f.name != "chat_template"}
        return ChatSettings(**values, chat_template=self._chat_template_text)

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> PreparedRequest:
        """Validate and render one call into engine inputs (raises typed errors)."""
        return prepare_request(messages, stop, kwargs, self._settings(), self._engine_for)

    def _hop(self, messages: Any, stop: Any, kwargs: dict[str, Any], run_manager: Any) -> Any:
        return open_hop(self, self._prepare, self._settings(), self._engine_for, messages,
                        stop, kwargs, run_manager)

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
        hop = self._hop(messages, stop, kwargs, run_manager)
        return hop.finish(chat_result(hop.prepared, hop.generate()))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        hop = await asyncio.to_thread(self._hop, messages, stop, kwargs, run_manager)
        return await hop.afinish(chat_result(hop.prepared, await hop.agenerate()))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        hop = self._hop(messages, stop, kwargs, run_manager)
        prepared, assembler, stream = hop.prepared, hop.prepared.new_assembler(), hop.stream()
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
        hop.finish_stream(assembler)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        hop = await asyncio.to_thread(self._hop, messages, stop, kwargs, run_manager)
        prepared, assembler, stream = hop.prepared, hop.prepared.new_assembler(), hop.astream()
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
        if hop.session is not None:
            await asyncio.to_thread(hop.finish_stream, assembler)

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
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Return a runnable whose output matches ``schema`` (``chat.structured_output``).

        Args:
            schema: A pydantic class (v2 or v1), a TypedDict, a JSON schema or an OpenAI tool
                dict; None only with ``method="json_mode"`` (the reply is then a dict).
            method: ``"json_schema"`` (grammar-constrained JSON matching the schema),
                ``"function_calling"`` (a grammar-forced call of a tool with that schema) or
                ``"json_mode"`` (any JSON object; describe the format in the prompt).
            include_raw: Return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``.
            strict: Accepted for compatibility; the constrained methods are always strict.

        Returns:
            A pydantic instance for a pydantic schema, else a dict.
        """
        return structured_output(self, schema, method=method, include_raw=include_raw,
                                 strict=strict, kwargs=kwargs)
