"""Request preparation: LangChain messages + call arguments -> prompt ids and sampling params.

No torch at import. :func:`prepare_request` is the whole path of one call; the steps are pure
functions tested on their own:

1. :func:`check_call_kwargs` — only the arguments a call may carry;
2. :func:`~langchain_ascend.chat.messages.to_template_messages` — messages to template dicts;
3. :func:`normalize_tool_choice` — LangChain/OpenAI spellings to ``auto``/``none``/
   ``required``/a name;
4. tool support (:mod:`~langchain_ascend.chat.tool_support`): the template's own tool
   rendering or the fallback format;
5. the grammar (:func:`~langchain_ascend.structured.selection.grammar_spec`);
6. :func:`template_kwargs_for` and :func:`prompt_token_ids` — render and tokenize;
7. :func:`max_tokens_for` — the reply budget within the context;
8. :func:`sampling_values` over :func:`generation_defaults` — temperature, top-p, top-k,
   min-p, the penalties, stop.

Steps 2-6 are :func:`build_prompt`, which token counting (``chat.token_count``) runs too, so
a count is the ``input_tokens`` of the same call.

Every problem is a typed error (``InvalidRequestError``, ``PromptTooLongError``,
``ChatTemplateError``, ``UnsupportedContentError``) raised before the engine sees the request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from langchain_ascend.chat.call_ids import reply_call_ids
from langchain_ascend.chat.checks import check_conversation_text, check_sampling, stop_list
from langchain_ascend.chat.content_text import control_spellings
from langchain_ascend.chat.messages import (
    render_prompt,
    to_template_messages,
    to_template_tools,
    tool_names_of,
)
from langchain_ascend.chat.model_names import readable_model_name
from langchain_ascend.chat.reasoning import prompt_opens_reasoning
from langchain_ascend.chat.reply import ReplyAssembler, reply_marker_ids
from langchain_ascend.chat.template import template_stop_token_ids, with_chat_template
from langchain_ascend.chat.tool_support import (
    ToolCallFormatSetting,
    ToolSupport,
    apply_fallback,
    check_tools_usable,
    resolve_tool_support,
)
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.errors import InvalidRequestError, InvalidTextError, PromptTooLongError
from langchain_ascend.structured.grammars import GrammarSpec
from langchain_ascend.structured.selection import grammar_backend, grammar_spec
from langchain_ascend.validation import check_count, check_text

# Arguments a call may carry (from bind / invoke kwargs) besides messages and stop.
CALL_KWARGS = frozenset(
    {
        "model", "tools", "tool_choice", "parallel_tool_calls", "response_format",
        "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "chat_template_kwargs",
        "ignore_eos", "speculative_decoding", "num_speculative_tokens", "repetition_penalty",
        "presence_penalty", "frequency_penalty", "min_p", "reasoning", "stream_usage",
        "budget_closed_output", "max_tokens_overflow",
    }
)
FORCING_CHOICES = ("required", "any")
FLOAT_SAMPLING = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty")
"""Float sampling values a call, the instance or the model's generation config may set."""


@dataclass(frozen=True)
class ChatSettings:
    """A chat model's request settings (each but ``tool_call_format`` and
    ``parse_reasoning`` may be overridden per call). Field meanings as on ``AscendChatModel``."""

    model: str
    gguf_file: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Sequence[str] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    reasoning: bool | str | None = None
    stream_usage: bool = True
    ignore_eos: bool = False
    budget_closed_output: str = "cut"
    speculative_decoding: str = "auto"
    num_speculative_tokens: int = 8
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_call_format: ToolCallFormatSetting = "auto"
    parse_reasoning: bool = True
    chat_template: str | None = None
    """The Jinja source the chat model was given (``chat_template=``, read from its file),
    rendering ``model``'s prompts instead of its tokenizer's template; None: the tokenizer's."""


@dataclass
class PreparedRequest:
    """Everything one call sends to the engine and needs to read the reply back."""

    engine: Any
    model_name: str
    prompt_token_ids: list[int]
    params: Any  # SamplingParams
    assembler_kwargs: dict[str, Any]
    forced: str | None = None
    """What a grammar forces, for the cut-short note (``"tool call (tool_choice='required')"``,
    ``"structured output"``); None for free text."""
    forced_tool: bool = False
    stream_usage: bool = True
    """Whether the last streamed chunk carries ``usage_metadata``."""

    def new_assembler(self) -> ReplyAssembler:
        """A fresh reply assembler for this request's reply."""
        return ReplyAssembler(**self.assembler_kwargs)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's vocabulary."""
        return len(self.engine.tokenizer.encode(text, add_special_tokens=False))


def check_call_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Raises:
    InvalidRequestError: An argument outside :data:`CALL_KWARGS`."""
    unknown = set(kwargs) - CALL_KWARGS
    if unknown:
        raise InvalidRequestError(
            f"unsupported call argument(s) {sorted(unknown)}; supported: {sorted(CALL_KWARGS)}"
        )
    check_sampling(kwargs)


def normalize_tool_choice(tool_choice: Any, tool_names: Sequence[str]) -> str:
    """Map LangChain/OpenAI ``tool_choice`` spellings to "auto", "none", "required" or a name.

    Raises:
        InvalidRequestError: An unknown spelling or a name that is not a bound tool.
    """
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("auto", "any", "none"):
        tool_choice = tool_choice["type"]  # Anthropic's spelling
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if tool_choice is True or tool_choice in FORCING_CHOICES:
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
            "True, a tool name, {'type': 'function', 'function': {'name': ...}} or "
            "{'type': 'any'}"
        )
    if name not in tool_names:
        raise InvalidRequestError(
            f"tool_choice names {name!r}, which is not one of the bound tools {list(tool_names)}"
        )
    return name


def template_kwargs_for(
    base: Mapping[str, Any], call: Mapping[str, Any] | None, spec: GrammarSpec | None,
    reasoning: bool | str | None = None,
) -> dict[str, Any]:
    """Template variables: the instance's, then ``reasoning`` (True/False: the
    ``enable_thinking`` switch; ``"low"``/``"medium"``/``"high"``: thinking on with that
    ``reasoning_effort``), then the call's; a grammar that starts at the first token (JSON,
    forced calls) leaves no room for ``<think>``, so ``enable_thinking`` defaults to False
    under it."""
    merged = dict(base)
    if isinstance(reasoning, bool):
        merged["enable_thinking"] = reasoning
    elif isinstance(reasoning, str):
        merged.update(enable_thinking=True, reasoning_effort=reasoning)
    merged.update(call or {})
    if spec is not None and not spec.free_text:
        merged.setdefault("enable_thinking", False)
    return merged


def prompt_token_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: Mapping[str, Any],
) -> tuple[list[int], str]:
    """Render the prompt through the chat template and tokenize it: ``(ids, text)``."""
    prompt = render_prompt(tokenizer, messages, tools=tools, template_kwargs=template_kwargs)
    check_text("the rendered prompt (tools or template variables)", prompt, InvalidTextError)
    return list(tokenizer.encode(prompt, add_special_tokens=False)), prompt


def max_tokens_for(requested: Any, num_prompt_tokens: int, max_context_length: int,
                   overflow: str = "cap") -> int:
    """The reply budget: ``requested`` within the room the prompt leaves (all of it when
    ``requested`` is None). A ``requested`` past that room is capped to it, or with
    ``overflow="error"`` refused, as OpenAI's and vLLM's servers refuse it.

    Raises:
        PromptTooLongError: The prompt leaves no room, or (``overflow="error"``) less than
            ``requested``.
        InvalidRequestError: ``requested`` is not an integer >= 1 (an
            ``InvalidArgumentTypeError`` for a wrong type).
    """
    room = max_context_length - num_prompt_tokens
    if room <= 0:
        raise PromptTooLongError(
            f"the prompt has {num_prompt_tokens} tokens, which leaves no room to generate "
            f"within max_context_length={max_context_length}"
        )
    check_count("max_tokens", requested, allow_none=True)
    if requested is not None and requested > room and overflow == "error":
        raise PromptTooLongError(
            f"max_tokens={requested} does not fit: the context holds {max_context_length} "
            f"tokens and the prompt has {num_prompt_tokens}, which leaves {room}; reduce "
            "the messages or max_tokens")
    return room if requested is None else min(requested, room)


def sampling_values(
    settings: ChatSettings,
    kwargs: Mapping[str, Any],
    stop: Sequence[str] | None,
    spec: GrammarSpec | None,
    defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """Sampling arguments (besides ``max_tokens``): call value, else instance value, else the
    model's generation defaults (:func:`generation_defaults`: ``repetition_penalty`` and, where
    the model samples, temperature, top-p, top-k and min-p). A grammar that decides where the
    reply ends (not free text) drops the stop strings; ``ignore_eos`` never applies under a
    grammar."""
    def pick(name: str, kind: type) -> Any:
        value = kwargs.get(name, getattr(settings, name))
        return defaults[name] if value is None else kind(value)

    stops = (stop_list(stop) or []) if stop is not None else list(settings.stop or [])
    if spec is not None and not spec.free_text:
        stops = []
    return {
        **{name: pick(name, float) for name in FLOAT_SAMPLING},
        "top_k": pick("top_k", int),
        "seed": kwargs.get("seed", settings.seed),
        "stop": stops,
        "ignore_eos": bool(kwargs.get("ignore_eos", settings.ignore_eos)) and spec is None,
        "speculation": kwargs.get("speculative_decoding", settings.speculative_decoding),
        "num_speculative_tokens": kwargs.get("num_speculative_tokens",
                                             settings.num_speculative_tokens),
    }


_GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {}
_GENERATION_DEFAULTS_LOCK = threading.Lock()


def generation_defaults(model_path: Any) -> dict[str, Any]:
    """Sampling defaults from the model's ``generation_config.json``
    (``engine.hf_config.generation_defaults``), cached per model path."""
    key = str(model_path)
    with _GENERATION_DEFAULTS_LOCK:
        cached = _GENERATION_DEFAULTS.get(key)
    if cached is not None:
        return cached
    defaults = hf_config.generation_defaults(key)
    with _GENERATION_DEFAULTS_LOCK:
        _GENERATION_DEFAULTS[key] = defaults
    return defaults


def chat_tokenizer(engine: Any, settings: ChatSettings, model_name: str) -> Any:
    """``engine``'s tokenizer as the chat model renders prompts with it: through the settings'
    ``chat_template`` when ``model_name`` is the chat model's own model (a per-call ``model=``
    keeps that model's template), else as it is. The engine's tokenizer is never modified
    (see :mod:`~langchain_ascend.chat.template`)."""
    template = settings.chat_template if model_name == settings.model else None
    return with_chat_template(engine.tokenizer, template)


def tool_support_for(engine: Any, settings: ChatSettings, model_name: str) -> ToolSupport:
    """How the template ``engine``'s requests render with carries tools under the settings
    (logged once)."""
    return resolve_tool_support(
        chat_tokenizer(engine, settings, model_name), settings.tool_call_format,
        model_name=model_name,
    )


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one call and how they reach the model and come back."""

    tools: list[dict[str, Any]]
    names: list[str]
    choice: str
    parse: bool  # replies are read for calls (tools bound and choice not "none")
    support: ToolSupport


def tool_request(kwargs: Mapping[str, Any], settings: ChatSettings, engine: Any,
                 model_name: str) -> ToolRequest:
    """The call's tools, its normalised ``tool_choice`` and the template's tool support.

    Raises:
        InvalidRequestError: A forcing ``tool_choice`` without tools.
        ChatTemplateError: Tools bound but nothing would show them to the model.
    """
    tools = to_template_tools(kwargs.get("tools") or [])
    names = tool_names_of(tools)
    choice = normalize_tool_choice(kwargs.get("tool_choice"), names)
    if choice not in ("auto", "none") and not tools:
        raise InvalidRequestError(f"tool_choice={choice!r} but no tools are bound")
    support = tool_support_for(engine, settings, model_name)
    if tools:
        check_tools_usable(support, settings.tool_call_format, model_name=model_name)
    # With tool_choice="none" the tools stay in the prompt (same prefix, same KV cache as the
    # hops that call tools); a grammar keeps call markers out of the reply instead.
    return ToolRequest(tools, names, choice, bool(tools) and choice != "none", support)


def sampling_params_for(engine: Any, tokenizer: Any, settings: ChatSettings,
                        kwargs: Mapping[str, Any], stop: Sequence[str] | None,
                        spec: GrammarSpec | None, num_prompt_tokens: int,
                        special: Mapping[str, int], calls: ToolRequest) -> SamplingParams:
    """The engine's sampling parameters of one call, validated, with its grammar constraint."""
    max_tokens = max_tokens_for(
        kwargs.get("max_tokens", settings.max_tokens), num_prompt_tokens,
        engine.max_context_length, kwargs.get("max_tokens_overflow", "cap"))
    # A given template's end-of-turn token ends the reply where the model's EOS would not.
    stop_token_ids = ([] if kwargs.get("ignore_eos", settings.ignore_eos) or tokenizer is
                      engine.tokenizer else
                      template_stop_token_ids(engine.tokenizer, tokenizer.chat_template))
    params = SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=stop_token_ids,
        **sampling_values(settings, kwargs, stop, spec, generation_defaults(engine.model_path)),
        keep_special_token_ids=reply_marker_ids(
            special, tool_format=calls.support.fmt, parse_tools=calls.parse,
            parse_reasoning=settings.parse_reasoning),
    )
    params.validate()
    if spec is not None:
        closed = kwargs.get("budget_closed_output", settings.budget_closed_output)
        params.constraint = grammar_backend(engine).new_constraint(
            spec, max_tokens=max_tokens, report_shortened=closed == "cut")
    return params


@dataclass(frozen=True)
class Prompt:
    """One call's rendered prompt and what rendering it decided (steps 2-6)."""

    engine: Any
    model_name: str
    tokenizer: Any
    calls: ToolRequest
    spec: GrammarSpec | None
    special: Mapping[str, int]
    token_ids: list[int]
    text: str


def build_prompt(
    messages: Sequence[BaseMessage],
    kwargs: Mapping[str, Any],
    settings: ChatSettings,
    engine_for: Callable[[str], Any],
    *,
    strict: bool = True,
) -> Prompt:
    """Render one call's conversation, tools and template variables into prompt ids.

    Args:
        messages: The conversation.
        kwargs: The call's arguments (tools, tool_choice, response_format, model, reasoning,
            chat_template_kwargs...).
        settings: The chat model's settings.
        engine_for: Returns the object holding a model's ``tokenizer`` (the shared engine,
            or for counting only, the tokenizer alone).
        strict: Refuse what a call refuses (a ``ToolMessage`` answering no call, a
            conversation without text); False renders such partial conversations as they
            are (token counting of ``trim_messages``' slices).

    Raises:
        InvalidRequestError, ChatTemplateError, UnsupportedContentError: As for
            :func:`prepare_request`.
    """
    template_messages = to_template_messages(messages, strict=strict)  # checked first
    if strict:
        check_conversation_text(template_messages)
    model_name = kwargs.get("model") or settings.model
    engine = engine_for(model_name)
    tokenizer = chat_tokenizer(engine, settings, model_name)
    # content spelling a control token stays text (chat.content_text), before any marker of ours
    template_messages = to_template_messages(messages, strict=strict,
                                             spellings=control_spellings(tokenizer))
    calls = tool_request(kwargs, settings, engine, model_name)
    fallback = calls.support.fallback
    if fallback:
        template_messages = apply_fallback(template_messages, calls.tools)
    special = special_tokens_of(engine.tokenizer)
    spec = grammar_spec(
        response_format=kwargs.get("response_format"), tools=calls.tools,
        tool_choice=calls.choice, parallel_tool_calls=kwargs.get("parallel_tool_calls"),
        fmt=calls.support.fmt, special_tokens=set(special),
    )
    template_kwargs = template_kwargs_for(
        settings.chat_template_kwargs, kwargs.get("chat_template_kwargs"), spec,
        kwargs.get("reasoning", settings.reasoning),
    )
    ids, text = prompt_token_ids(
        tokenizer, template_messages, None if fallback else calls.tools or None, template_kwargs,
    )
    return Prompt(engine, model_name, tokenizer, calls, spec, special, ids, text)


def prepare_request(
    messages: Sequence[BaseMessage],
    stop: Sequence[str] | None,
    kwargs: Mapping[str, Any],
    settings: ChatSettings,
    engine_for: Callable[[str], Any],
) -> PreparedRequest:
    """Validate and render one call into engine inputs.

    Args:
        messages: The conversation.
        stop: The call's stop strings (``None``: the settings').
        kwargs: The call's arguments (bound and per-call; see :data:`CALL_KWARGS`).
        settings: The chat model's settings.
        engine_for: Returns the shared engine of a model name (loads it on first use).

    Raises:
        InvalidRequestError, PromptTooLongError, ChatTemplateError, UnsupportedContentError:
            See the module docstring.
    """
    check_call_kwargs(kwargs)
    prompt = build_prompt(messages, kwargs, settings, engine_for)
    calls, spec = prompt.calls, prompt.spec
    params = sampling_params_for(prompt.engine, prompt.tokenizer, settings, kwargs, stop, spec,
                                 len(prompt.token_ids), prompt.special, calls)
    forced_tool = calls.choice not in ("auto", "none")
    forced = (f"tool call (tool_choice={calls.choice!r})" if forced_tool
              else "structured output" if spec is not None and not spec.free_text else None)
    return PreparedRequest(
        engine=prompt.engine,
        model_name=readable_model_name(
            prompt.model_name, settings.gguf_file if prompt.model_name == settings.model
            else None),
        prompt_token_ids=prompt.token_ids,
        params=params,
        assembler_kwargs={
            "parse_tools": calls.parse,
            "tool_format": calls.support.fmt,
            "tool_names": calls.names,
            "parse_reasoning": settings.parse_reasoning,
            "start_in_reasoning": (settings.parse_reasoning
                                   and prompt_opens_reasoning(prompt.text)),
            "id_factory": reply_call_ids(prompt.token_ids),
        },
        forced=forced,
        forced_tool=forced_tool,
        stream_usage=bool(kwargs.get("stream_usage", settings.stream_usage)),
    )
