"""The chat model's constructor fields, by job: how the engine runs (:class:`EngineFields`) and
how replies are sampled (:class:`SamplingFields`). ``AscendChatModel`` inherits both (pydantic
merges the fields); every field's docstring is its documentation. No torch.

Spellings other chat models use (``model_path``, ``n_ctx``, ``max_new_tokens``...) are mapped
to these names by :mod:`langchain_ascend.chat.arguments` before validation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class EngineFields(BaseModel):
    """Where the model loads and how its shared engine runs (engine settings are fixed per
    engine: the first chat model on a model/device/dtype sets them)."""

    gguf_file: str | None = None
    """Which GGUF file of a folder (or hub snapshot) holding several to load."""

    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Loading options of a hub model: ``{"revision": "<branch, tag or commit>"}``. Sampling
    keys given here (``{"repetition_penalty": 1.1}``) are moved to their fields; anything else
    is an ``InvalidRequestError`` naming it."""

    quantization: Literal["auto", "gguf", "int8", "int4", "none"] | None = "auto"
    """How the weights are held: ``"auto"`` (a ``.gguf`` model's own blocks, as ``"gguf"``;
    an HF folder's float weights), ``"gguf"`` (run the file's ``Q4_0`` / ``Q4_1`` / ``Q8_0``
    blocks as they are, no conversion; other block types re-quantized to the nearest, logged),
    ``"int8"`` / ``"int4"`` (every linear layer, LM head included, in 8-bit / 4-bit blocks of
    32, quantized at load, from a GGUF file or an HF folder), None or ``"none"`` (float; a
    GGUF file is de-quantized once into float32 in the package cache).
    ``engine.stats().weights`` reports the format and bytes."""

    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """What the KV cache stores keys and values in: ``"auto"`` (float16 for quantized
    weights on the CPU, as llama.cpp's cache: half the bytes a decode reads per cached token;
    the model's dtype everywhere else), or a dtype (float16 under a float32 model on the CPU
    only where the native paged kernel runs: an error names this argument otherwise)."""

    device: str = "auto"
    """``"auto"`` (NPU, else CUDA, else CPU), ``"npu"``, ``"npu:1"``, ``"cuda"``, ``"cpu"``."""

    dtype: str = "auto"
    """``"auto"`` (bfloat16 on NPU/CUDA, float32 on CPU), or ``"bfloat16"``, ``"float16"``…"""

    max_context_length: int | None = None
    """Most tokens (prompt + reply) per request; default the model's maximum. Also spelled
    ``n_ctx``, ``num_ctx`` or ``max_model_len``. ``profile["max_input_tokens"]`` reports it."""

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

    scheduling: Literal["fcfs", "agent"] = "fcfs"
    """The engine's waiting queue: first come first served, or ``"agent"`` (least attained
    service per agent session; a resuming hop with a retained prefix first among equals)."""

    session_retention: bool = True
    """Keep an agent session's KV blocks while its tools run (``engine.core.retention``)."""

    retention_cap: float = Field(default=0.5, gt=0, le=1)
    """Most of the KV pool that retained sessions may hold."""


class SamplingFields(BaseModel):
    """How a reply is generated; each may be overridden per call (``invoke(..., top_k=5)``).
    ``None`` means the model's ``generation_config.json`` value, else the neutral one."""

    max_tokens: int | None = Field(default=None, alias="max_new_tokens")
    """Most tokens to generate per call; ``None`` = until the context limit. A value past the
    room the prompt leaves in the context is capped to it; a call's
    ``max_tokens_overflow="error"`` refuses it instead (``PromptTooLongError``, as the server
    answers an explicit ``max_tokens`` that does not fit)."""

    temperature: float | None = None
    """Sampling temperature; 0 = greedy; ``None`` = the model's generation config (greedy when
    it has none)."""

    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]; ``None`` = the generation config's, else 1."""

    top_k: int | None = None
    """Keep only the k most likely tokens; ``None`` = the generation config's, else off."""

    min_p: float | None = None
    """Keep only tokens at least ``min_p`` times as likely as the best, in [0, 1] (sampling
    only); ``None`` = the generation config's, else off."""

    repetition_penalty: float | None = None
    """Hugging Face's repetition penalty (> 0; 1 = off, > 1 discourages any token already in
    the prompt or the reply; greedy replies too); ``None`` = the generation config's
    ``repetition_penalty`` (as ``generate`` applies it), else off. Also ``repeat_penalty``."""

    presence_penalty: float | None = None
    """OpenAI's presence penalty in [-2, 2]: subtracted once from every token the reply already
    holds; ``None`` = 0."""

    frequency_penalty: float | None = None
    """OpenAI's frequency penalty in [-2, 2]: subtracted per occurrence in the reply so far;
    ``None`` = 0."""

    seed: int | None = None
    """Seed for sampling (temperature > 0): the same seed gives the same reply."""

    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Stop strings; the reply ends before the first one (not included)."""

    speculative_decoding: Literal["auto", "prompt_lookup", "off"] = "auto"
    """Several tokens per pass: greedy replies draft from their own context (prompt lookup),
    grammar replies jump over forced text; ``"auto"`` drafts where it pays and is exact
    (float32), see ``engine.core.speculation``. Replies with a penalty never draft. Per call
    too; ``response_metadata["speculative"]`` reports it."""

    num_speculative_tokens: int = 8
    """Most drafted tokens per pass (0..16; the draft length adapts up to it); per call too."""

    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence tokens until ``max_tokens`` (for
    benchmarks that need a fixed reply length). Grammar-constrained replies still end with
    their grammar."""

    budget_closed_output: Literal["cut", "complete"] = "cut"
    """A constrained reply (a forced tool call, structured output) that the budget guard closed
    early to fit ``max_tokens``, taking away the token the model preferred before the reply
    could end (valid, but shorter than what the model was writing: ``"Bang"`` for
    ``"Bangladesh"``): ``"cut"`` reports it as cut (``finish_reason="length"``,
    ``response_metadata["output_error"]``, a forced call an ``invalid_tool_calls`` entry,
    structured output no value), so no tool runs with what the budget left of its arguments;
    ``"complete"`` returns it as the valid reply it is. Per call too."""
