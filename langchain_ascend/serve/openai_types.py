"""Request bodies of the OpenAI endpoints as pydantic models (what ``/docs`` shows).

Strict on purpose: unknown fields are errors (an unsupported parameter gets a 400 naming it,
never silent acceptance), types are not coerced (``"0.5"`` is not a temperature, ``true`` is
not a count). Fields OpenAI has that we accept only at their no-op value (``n=1``,
``logprobs=false``, zero penalties) are declared and checked in
:func:`~langchain_ascend.serve.convert.check_supported`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Strict(BaseModel):
    """Unknown keys are errors; no type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class CacheControl(Strict):
    """Anthropic-style ``cache_control`` on a content part: with a ``prompt_cache_key`` its
    ``ttl`` (``"5m"``, ``"1h"``) is how long the session's KV blocks may stay retained."""

    type: Literal["ephemeral"]
    ttl: str | None = None


class TextPart(Strict):
    """A text part of a message's content (the only kind this server reads)."""

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class FunctionCall(Strict):
    """The function of an assistant's tool call: its name and JSON-encoded arguments."""

    name: str = Field(min_length=1)
    arguments: str


class ToolCall(Strict):
    """A tool call in an assistant message of the history."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    """One message; which fields a role needs is checked when it is converted."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class FunctionDefinition(Strict):
    """A tool's function: name, description and JSON-schema parameters."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    """A tool the model may call."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(Strict):
    """``{"type": "function", "function": {"name": ...}}``: call exactly that tool."""

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Strict):
    """``response_format.json_schema``: the schema the reply must match."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    """``text`` (free), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Strict):
    include_usage: bool | None = None


class ChatCompletionRequest(Strict):
    """``POST /v1/chat/completions``."""

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # vLLM's extra sampling parameter (not OpenAI's): generate past the end-of-text tokens,
    # so every reply is max_tokens long (benchmarks).
    ignore_eos: bool | None = None
    # Accepted only at their no-op value (checked in convert.check_supported).
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    # OpenAI's prompt caching: the key names the agent session whose KV blocks the engine
    # keeps while its tools run; the retention is "in_memory" (a TTL from the tools'
    # measured latency) or a duration ("24h"; also "5m", "300s").
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=256)
    prompt_cache_retention: str | None = None
    # Bookkeeping fields that change nothing in the reply.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class EmbeddingRequest(Strict):
    """``POST /v1/embeddings``: one text or a list of texts."""

    model: str = Field(min_length=1)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_not_token_ids(cls, value: Any) -> Any:
        """Token ids (OpenAI takes them) are ids of OpenAI's tokenizer, which mean nothing to
        this model's: refused with what to send instead (``OpenAIEmbeddings`` sends them
        unless ``check_embedding_ctx_length=False``)."""
        items = value if isinstance(value, list) else [value]
        if any(isinstance(i, int) or (isinstance(i, list) and i and isinstance(i[0], int))
               for i in items):
            raise ValueError(
                "input as token ids is not supported (they are ids of another tokenizer): "
                "send the text; langchain_openai's OpenAIEmbeddings sends text with "
                "check_embedding_ctx_length=False")
        if value == "":
            raise ValueError("input is an empty string: send some text")
        if isinstance(value, list) and "" in value:
            raise ValueError(f"input[{value.index('')}] is an empty string (OpenAI refuses it "
                             "too): send some text in every item")
        return value


class AgentRequest(Strict):
    """``POST /v1/agent``: the conversation for the configured agent (``--config``)."""

    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    model: str | None = None
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=256)
    """The run's agent session (default: a fresh one per run)."""
