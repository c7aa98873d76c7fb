"""What the engine reads from a Hugging Face model's configuration, read in one place.

``config.json`` arrives as the loaded model's ``config`` (multimodal configs nest the decoder's
as ``get_text_config()``); ``generation_config.json`` is read from the model folder.
"""

from __future__ import annotations

from typing import Any

#: End-of-turn markers of common chat templates (ChatML, Llama-3, Phi-3, Gemma): where a
#: template writes one and the tokenizer has it as a token, a reply ends there even if the
#: model's EOS is another token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def text_config(config: Any) -> Any:
    """The decoder's config: ``config.get_text_config()`` where it exists, else ``config``."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def vocab_size(config: Any) -> int | None:
    """The vocabulary size, or None where the config does not say."""
    size = getattr(config, "vocab_size", None)
    if size is None:
        size = getattr(text_config(config), "vocab_size", None)
    return int(size) if size else None


def max_position_embeddings(config: Any) -> int:
    """The longest context the model supports (``2**31 - 1`` where the config has none)."""
    return int(getattr(text_config(config), "max_position_embeddings", 0) or 0) or 2**31 - 1


def attention_geometry(config: Any) -> tuple[int, int, int, int]:
    """``(num_layers, num_heads, num_kv_heads, head_dim)`` of a decoder-only HF config."""
    text = text_config(config)
    num_heads = text.num_attention_heads
    num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
    return text.num_hidden_layers, num_heads, num_kv_heads, head_dim


def attention_cost_context(config: Any, attention_slowdown: float | None) -> float | None:
    """The context length at which a token's attention costs what its products cost: the
    multiply-adds of a layer stack's linear layers per token over those of attention per key
    (scores and values, every head), over how much slower attention runs per multiply-add
    (``attention_slowdown``: ``platform.prefill_attention_slowdown``). None where either is
    None or the config lacks the sizes (the scheduler then counts plain tokens).

    SmolLM2-135M: 106M / 34.6k = 3,070, over 3 on the CPU ~1,000 (measured: 256 tokens after
    4,096 cached ones took 5.1x the time of the same 256 at the start)."""
    if config is None or attention_slowdown is None:
        return None
    text = text_config(config)
    hidden = getattr(text, "hidden_size", None)
    intermediate = getattr(text, "intermediate_size", None)
    if not hidden or not intermediate:
        return None
    num_layers, num_heads, num_kv_heads, head_dim = attention_geometry(config)
    projections = hidden * head_dim * (2 * num_heads + 2 * num_kv_heads)  # q, o; k, v
    linear = num_layers * (projections + 3 * hidden * intermediate)  # gated MLP
    per_key = num_layers * num_heads * head_dim * 2
    return linear / per_key / attention_slowdown


def generation_config(model_path: str) -> Any:
    """The folder's ``generation_config.json`` as a ``GenerationConfig``, or None without one."""
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def default_eos_token_ids(model_path: str, config: Any, tokenizer: Any) -> list[int]:
    """EOS ids of a model: ``generation_config.json``'s ``eos_token_id`` (int or list; the
    model config's when that file is missing) plus the tokenizer's EOS token."""
    ids: list[int] = []
    generation = generation_config(model_path)
    if generation is not None:
        ids += _as_id_list(generation.eos_token_id)
    else:
        ids += _as_id_list(getattr(text_config(config), "eos_token_id", None))
    ids += _as_id_list(getattr(tokenizer, "eos_token_id", None))
    return list(dict.fromkeys(ids))


def end_of_turn_token_ids(template: str, tokenizer: Any) -> list[int]:
    """Ids of the :data:`END_OF_TURN_TOKENS` that ``template`` writes and ``tokenizer`` holds as
    one token (looked up both ways, so an unknown marker mapped to ``<unk>`` is left out)."""
    ids: list[int] = []
    for marker in END_OF_TURN_TOKENS:
        if marker not in template:
            continue
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == marker:
            ids.append(token_id)
    return ids


def stop_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """EOS ids to stop at for a model made from a GGUF file: the generation config's, the
    tokenizer's, and the end-of-turn token of the chat template (``<|im_end|>`` for
    ChatML...) when the tokenizer has it."""
    ids: list[int] = []
    raw = getattr(generation_config, "eos_token_id", None)
    for value in (raw if isinstance(raw, (list, tuple)) else [raw]):
        if isinstance(value, int):
            ids.append(value)
    if isinstance(tokenizer.eos_token_id, int):
        ids.append(tokenizer.eos_token_id)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    ids += end_of_turn_token_ids(template, tokenizer)
    return list(dict.fromkeys(ids))


def generation_defaults(model_path: str) -> dict[str, Any]:
    """Sampling defaults from ``generation_config.json``, as ``generate`` reads them: its
    temperature, top-p, top-k and min-p where it samples (``do_sample``), greedy otherwise or
    without the file; its ``repetition_penalty`` either way (transformers applies it to greedy
    decoding too). Presence and frequency penalties are not transformers settings: 0."""
    config = generation_config(model_path)
    defaults: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                "repetition_penalty": 1.0}
    if config is None:
        return defaults
    penalty = getattr(config, "repetition_penalty", None)
    if penalty is not None:
        defaults["repetition_penalty"] = float(penalty)
    if getattr(config, "do_sample", False):
        defaults.update(
            temperature=float(config.temperature if config.temperature is not None else 1.0),
            top_p=float(config.top_p if config.top_p is not None else 1.0),
            top_k=int(config.top_k or 0),
            min_p=float(getattr(config, "min_p", None) or 0.0))
    return defaults
