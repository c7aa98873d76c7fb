"""AscendChatModel: a LangChain chat model served by langchain-ascend's own engine.

Thin on purpose: message conversion lives in ``_messages``, reply post-processing in
``_output`` / ``_reasoning`` / ``tool_parsers``, grammars in ``structured``; the engine
(``engine.engine.get_engine``) owns the model, the paged KV cache and the batch. Importing
this module imports no torch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils import from_env
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from langchain_ascend.chat.messages import (
    render_prompt,
    to_template_messages,
    to_template_tools,
    tool_names_of,
)
from langchain_ascend.chat.reasoning import prompt_opens_reasoning
from langchain_ascend.chat.reply import (
    ReplyAssembler,
    ReplyPiece,
    special_marker_ids,
    text_with_markers,
)
from langchain_ascend.chat.tool_parsers import ToolCallFormat
from langchain_ascend.chat.tool_support import (
    ToolCallFormatSetting,
    ToolSupport,
    apply_fallback,
    check_tools_usable,
    resolve_tool_support,
)
from langchain_ascend.errors import InvalidRequestError, PromptTooLongError
from langchain_ascend.structured.grammars import (
    GrammarSpec,
    json_object_grammar,
    json_schema_grammar,
    no_tool_call_grammar,
    tool_call_grammar,
)

logger = logging.getLogger(__name__)

# Constructor arguments other chat models take that mean nothing for a local model; accepted
# (and ignored) so ``ChatOpenAI(...)``-style code keeps working.
_IGNORED_INIT_ARGS = frozenset(
    {"api_key", "base_url", "timeout", "max_retries", "organization", "request_timeout"}
)
_FORCING_CHOICES = ("required", "any")


@dataclass
class _PreparedRequest:
    """Everything one call sends to the engine and needs to read the reply back."""

    engine: Any
    model_name: str
    prompt_token_ids: list[int]
    params: Any  # SamplingParams
    assembler_kwargs: dict[str, Any]
    marker_ids: dict[int, str] = field(default_factory=dict)


def _normalize_tool_choice(tool_choice: Any, tool_names: Sequence[str]) -> str:
    """Map LangChain/OpenAI ``tool_choice`` spellings to "auto", "none", "required" or a name.

    Raises:
        InvalidRequestError: An unknown spelling or a name that is not a bound tool.
    """
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if tool_choice is True or tool_choice in _FORCING_CHOICES:
        return "required"
    name = None
    if isinstance(tool_choice, str):
        name = tool_choice
    elif isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(
            f"unsupported tool_choice {tool_choice!r}: use 'auto', 'none', 'required'/'any', "
            "True, a tool name, or {'type': 'function', 'function': {'name': ...}}"
        )
    if name not in tool_names:
        raise InvalidRequestError(
            f"tool_choice names {name!r}, which is not one of the bound tools {list(tool_names)}"
        )
    return name


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
        or a tool name is *guaranteed* by constrained decoding (xgrammar): the reply is
        exactly such call(s), arguments valid against the tool's schema.

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
        default_factory=from_env(
            "LANGCHAIN_ASCEND_CHAT_MODEL",
            error_message="AscendChatModel needs model= (a local folder or hub id of a chat "
            "model), or the LANGCHAIN_ASCEND_CHAT_MODEL environment variable",
        ),
    )
    """Local folder or Hugging Face hub id of the chat model (weights and tokenizer); default
    ``$LANGCHAIN_ASCEND_CHAT_MODEL``."""

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
    """KV-cache blocks to allocate; default sized by ``kv_cache_memory_fraction``."""

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

    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence tokens until ``max_tokens`` (for
    benchmarks that need a fixed reply length). Grammar-constrained replies still end with
    their grammar."""

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
        return {k: v for k, v in values.items() if k not in _IGNORED_INIT_ARGS}

    @model_validator(mode="after")
    def _check_values(self) -> AscendChatModel:
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.kv_cache_memory_fraction <= 1:
            raise InvalidRequestError(
                f"kv_cache_memory_fraction must be in (0, 1], got {self.kv_cache_memory_fraction}"
            )
        return self

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
        }
        for key, value in (
            ("max_context_length", self.max_context_length),
            ("block_size", self.block_size),
            ("num_blocks", self.num_kv_blocks),
        ):
            if value is not None:
                engine_kwargs[key] = value
        engine = get_engine(name, device=self.device, dtype=self.dtype, **engine_kwargs)
        with self._engines_lock:
            self._engines[name] = engine
        return engine

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
        prompt = self._prompt_ids(
            engine, [{"role": "user", "content": "Hi"}], None, self.chat_template_kwargs
        )[0]
        engine.generate(prompt, SamplingParams(max_tokens=1))

    def _warm_up_specs(
        self, engine: Any, tools: Sequence[Any] | None, schemas: Sequence[Any] | None
    ) -> list[GrammarSpec]:
        """The grammars ``warm_up`` compiles: what ``json_mode``, ``tool_choice="required"``,
        each named tool, ``tool_choice="none"`` and ``with_structured_output(schema)`` ask for."""
        specs = [json_object_grammar()]
        if tools:
            formatted = to_template_tools(tools)
            resolved = self._tool_support(engine).fmt
            fmt = self._forced_format(resolved)
            special = set(_special_tokens(engine.tokenizer))
            specs.append(no_tool_call_grammar(resolved, special))
            specs.append(tool_call_grammar(formatted, fmt=fmt, parallel=True,
                                           special_tokens=special))
            specs += [
                tool_call_grammar(formatted, fmt=fmt, tool_name=name, special_tokens=special)
                for name in tool_names_of(formatted)
            ]
        specs += [json_schema_grammar(convert_to_json_schema(s)) for s in schemas or ()]
        return specs

    def _grammar_backend(self, engine: Any) -> Any:
        from langchain_ascend.structured.xgrammar_backend import get_grammar_backend

        return get_grammar_backend(
            engine.tokenizer,
            vocab_size=engine.vocab_size or len(engine.tokenizer),
            stop_token_ids=list(engine.eos_token_ids),
        )

    def _tool_support(self, engine: Any, model_name: str | None = None) -> ToolSupport:
        return resolve_tool_support(
            engine.tokenizer, self.tool_call_format, model_name=model_name or self.model
        )

    @staticmethod
    def _forced_format(fmt: ToolCallFormat) -> ToolCallFormat:
        return "hermes" if fmt == "auto" else fmt

    # ------------------------------------------------------------------ request building

    def _prompt_ids(
        self,
        engine: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> tuple[list[int], str]:
        prompt = render_prompt(
            engine.tokenizer, messages, tools=tools, template_kwargs=template_kwargs
        )
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        return list(ids), prompt

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> _PreparedRequest:
        """Validate and render one call into engine inputs (raises typed errors)."""
        from langchain_ascend.engine.core.sampling_params import SamplingParams

        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise InvalidRequestError(
                f"unsupported call argument(s) {sorted(unknown)}; supported: {sorted(_CALL_KWARGS)}"
            )
        template_messages = to_template_messages(messages)
        model_name = kwargs.get("model") or self.model
        engine = self._engine_for(model_name)

        tools: list[dict[str, Any]] = list(kwargs.get("tools") or [])
        tool_names = tool_names_of(tools)
        tool_choice = _normalize_tool_choice(kwargs.get("tool_choice"), tool_names)
        if tool_choice != "auto" and tool_choice != "none" and not tools:
            raise InvalidRequestError(f"tool_choice={tool_choice!r} but no tools are bound")
        # With tool_choice="none" the tools stay in the prompt (same prefix, same KV cache as
        # the hops that call tools); a grammar keeps call markers out of the reply instead.
        parse_tools = bool(tools) and tool_choice != "none"
        support = self._tool_support(engine, model_name)
        if tools:
            check_tools_usable(support, self.tool_call_format, model_name=model_name)
        if support.fallback:
            template_messages = apply_fallback(template_messages, tools)
        fmt = support.fmt

        spec = self._grammar_spec(engine, kwargs, tools, tool_choice, fmt)
        template_kwargs = {**self.chat_template_kwargs, **(kwargs.get("chat_template_kwargs") or {})}
        if spec is not None and not spec.free_text:
            # A JSON/tool-call grammar starts at the first token: no room for <think>.
            template_kwargs.setdefault("enable_thinking", False)
        prompt_ids, prompt_text = self._prompt_ids(
            engine, template_messages, None if support.fallback else tools or None,
            template_kwargs,
        )
        room = engine.max_context_length - len(prompt_ids)
        if room <= 0:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens, which leaves no room to generate "
                f"within max_context_length={engine.max_context_length}"
            )
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        max_tokens = room if max_tokens is None else min(max_tokens, room)

        defaults = _generation_defaults(engine)
        temperature = kwargs.get("temperature", self.temperature)
        top_p = kwargs.get("top_p", self.top_p)
        top_k = kwargs.get("top_k", self.top_k)
        stops = list(stop if stop is not None else (self.stop or []))
        if spec is not None and not spec.free_text:
            stops = []  # the grammar decides where the reply ends
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=defaults["temperature"] if temperature is None else float(temperature),
            top_p=defaults["top_p"] if top_p is None else float(top_p),
            top_k=defaults["top_k"] if top_k is None else int(top_k),
            seed=kwargs.get("seed", self.seed),
            stop=stops,
            ignore_eos=bool(kwargs.get("ignore_eos", self.ignore_eos)) and spec is None,
        )
        params.validate()
        if spec is not None:
            params.constraint = self._grammar_backend(engine).new_constraint(
                spec, max_tokens=max_tokens
            )
        marker_ids = special_marker_ids(_special_tokens(engine.tokenizer)) if parse_tools else {}
        return _PreparedRequest(
            engine=engine,
            model_name=model_name,
            prompt_token_ids=prompt_ids,
            params=params,
            assembler_kwargs={
                "parse_tools": parse_tools,
                "tool_format": fmt,
                "tool_names": tool_names,
                "parse_reasoning": self.parse_reasoning,
                "start_in_reasoning": self.parse_reasoning and prompt_opens_reasoning(prompt_text),
                "marker_ids": marker_ids,
            },
            marker_ids=marker_ids,
        )

    def _grammar_spec(
        self,
        engine: Any,
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]],
        tool_choice: str,
        fmt: ToolCallFormat,
    ) -> GrammarSpec | None:
        response_format = kwargs.get("response_format")
        if response_format is not None:
            return _response_format_grammar(response_format)
        if tool_choice == "auto" or (tool_choice == "none" and not tools):
            return None
        special = set(_special_tokens(engine.tokenizer))
        if tool_choice == "none":
            return no_tool_call_grammar(fmt, special)
        parallel = kwargs.get("parallel_tool_calls")
        if tool_choice == "required":
            return tool_call_grammar(
                tools, fmt=self._forced_format(fmt), parallel=parallel is not False,
                special_tokens=special,
            )
        return tool_call_grammar(
            tools, fmt=self._forced_format(fmt), tool_name=tool_choice, parallel=bool(parallel),
            special_tokens=special,
        )

    # ------------------------------------------------------------------ reply building

    def _metadata(
        self, prepared: _PreparedRequest, output: Any, assembler: ReplyAssembler
    ) -> tuple[UsageMetadata, dict[str, Any]]:
        stats = output.stats
        input_tokens = int(stats.num_prompt_tokens)
        output_tokens = int(stats.num_generated_tokens)
        usage = UsageMetadata(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
            input_token_details={"cache_read": int(stats.num_cached_tokens)},
        )
        if assembler.reasoning:
            tokenizer = prepared.engine.tokenizer
            reasoning_tokens = len(tokenizer.encode(assembler.reasoning, add_special_tokens=False))
            usage["output_token_details"] = {"reasoning": min(reasoning_tokens, output_tokens)}
        finish_reason = output.finish_reason
        if finish_reason == "stop" and any(c.valid for c in assembler.calls):
            finish_reason = "tool_calls"
        metadata = {
            "model_name": prepared.model_name,
            "model_provider": "ascend",
            "finish_reason": finish_reason,
            "stop_reason": output.stop_reason,
            "timings": {
                "queue": stats.queue_time,
                "time_to_first_token": stats.time_to_first_token,
                "decode": stats.decode_time,
            },
        }
        return usage, metadata

    def _message_from_output(self, prepared: _PreparedRequest, output: Any) -> AIMessage:
        assembler = ReplyAssembler(**prepared.assembler_kwargs)
        text = text_with_markers(
            prepared.engine.tokenizer, output.token_ids, output.text, prepared.marker_ids
        )
        assembler.feed(text)
        assembler.finish()
        usage, metadata = self._metadata(prepared, output, assembler)
        additional: dict[str, Any] = {}
        if assembler.reasoning:
            additional["reasoning_content"] = assembler.reasoning
        return AIMessage(
            content=assembler.content,
            additional_kwargs=additional,
            tool_calls=[c.to_tool_call() for c in assembler.calls if c.valid],
            invalid_tool_calls=[c.to_invalid_tool_call() for c in assembler.calls if not c.valid],
            usage_metadata=usage,
            response_metadata=metadata,
        )

    @staticmethod
    def _chunk(piece: ReplyPiece) -> AIMessageChunk:
        additional = {"reasoning_content": piece.reasoning} if piece.reasoning else {}
        return AIMessageChunk(
            content=piece.content,
            additional_kwargs=additional,
            tool_call_chunks=[c.to_chunk() for c in piece.calls],
        )

    def _last_chunk(
        self, prepared: _PreparedRequest, output: Any, assembler: ReplyAssembler,
        piece: ReplyPiece,
    ) -> AIMessageChunk:
        usage, metadata = self._metadata(prepared, output, assembler)
        chunk = self._chunk(piece)
        return AIMessageChunk(
            content=chunk.content,
            additional_kwargs=chunk.additional_kwargs,
            tool_call_chunks=chunk.tool_call_chunks,
            usage_metadata=usage,
            response_metadata=metadata,
            chunk_position="last",
        )

    # ------------------------------------------------------------------ generation

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prepared = self._prepare(messages, stop, kwargs)
        output = prepared.engine.generate(prepared.prompt_token_ids, prepared.params)
        message = self._message_from_output(prepared, output)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prepared = await asyncio.to_thread(self._prepare, messages, stop, kwargs)
        output = await prepared.engine.agenerate(prepared.prompt_token_ids, prepared.params)
        message = self._message_from_output(prepared, output)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        prepared = self._prepare(messages, stop, kwargs)
        assembler = ReplyAssembler(**prepared.assembler_kwargs)
        stream = prepared.engine.stream(prepared.prompt_token_ids, prepared.params)
        try:
            for delta in stream:
                chunk = self._delta_chunk(prepared, assembler, delta)
                if chunk is None:
                    continue
                if run_manager is not None:
                    run_manager.on_llm_new_token(_chunk_text(chunk.message), chunk=chunk)
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
        assembler = ReplyAssembler(**prepared.assembler_kwargs)
        stream = prepared.engine.astream(prepared.prompt_token_ids, prepared.params)
        try:
            async for delta in stream:
                chunk = self._delta_chunk(prepared, assembler, delta)
                if chunk is None:
                    continue
                if run_manager is not None:
                    await run_manager.on_llm_new_token(_chunk_text(chunk.message), chunk=chunk)
                yield chunk
        finally:
            await stream.aclose()

    def _delta_chunk(
        self, prepared: _PreparedRequest, assembler: ReplyAssembler, delta: Any
    ) -> ChatGenerationChunk | None:
        piece = assembler.feed(delta.text, delta.token_ids)
        if delta.finished:
            tail = assembler.finish()
            piece = ReplyPiece(
                content=piece.content + tail.content,
                reasoning=piece.reasoning + tail.reasoning,
                calls=piece.calls + tail.calls,
            )
            message = self._last_chunk(prepared, delta.output, assembler, piece)
            return ChatGenerationChunk(message=message)
        if not piece:
            return None
        return ChatGenerationChunk(message=self._chunk(piece))

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
                prompt, the reply is text guaranteed free of calls),
                ``"required"``/``"any"``/``True`` (at least one call, guaranteed), a tool name
                or ``{"type": "function", "function": {"name": ...}}`` (exactly that tool,
                guaranteed).
            parallel_tool_calls: With a forced choice, allow several calls in one reply
                (default: yes for ``"required"``, no for a named tool).
            strict: Accepted for compatibility; forced calls always match the schema.
            **kwargs: Further call arguments to bind.

        Raises:
            InvalidRequestError: A tool that cannot be converted, or a ``tool_choice`` naming
                no bound tool.
        """
        formatted = to_template_tools(tools)
        choice = _normalize_tool_choice(tool_choice, tool_names_of(formatted))
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


# Arguments a call may carry (from bind / invoke kwargs) besides messages and stop.
_CALL_KWARGS = frozenset(
    {
        "model", "tools", "tool_choice", "parallel_tool_calls", "response_format",
        "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "chat_template_kwargs",
        "ignore_eos",
    }
)


def _response_format_grammar(response_format: Any) -> GrammarSpec:
    """Grammar for an OpenAI-style ``response_format``.

    Raises:
        InvalidRequestError: An unknown or malformed ``response_format``.
    """
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_object":
            return json_object_grammar()
        if kind == "json_schema":
            body = response_format.get("json_schema") or {}
            schema = body.get("schema") if isinstance(body, Mapping) else None
            if isinstance(schema, Mapping):
                return json_schema_grammar(schema)
    raise InvalidRequestError(
        f"unsupported response_format {response_format!r}: use {{'type': 'json_object'}} or "
        "{'type': 'json_schema', 'json_schema': {'schema': {...}}}"
    )


def _chunk_text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else ""


def _special_tokens(tokenizer: Any) -> dict[str, int]:
    return {
        str(tok): int(idx)
        for tok, idx in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=False)
    }


_GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {}
_GENERATION_DEFAULTS_LOCK = threading.Lock()


def _generation_defaults(engine: Any) -> dict[str, Any]:
    """Sampling defaults from the model's ``generation_config.json`` (greedy without one)."""
    key = str(engine.model_path)
    with _GENERATION_DEFAULTS_LOCK:
        cached = _GENERATION_DEFAULTS.get(key)
    if cached is not None:
        return cached
    from langchain_ascend.engine.hf_config import generation_defaults

    defaults = generation_defaults(key)
    with _GENERATION_DEFAULTS_LOCK:
        _GENERATION_DEFAULTS[key] = defaults
    return defaults

