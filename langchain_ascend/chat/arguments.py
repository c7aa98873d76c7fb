"""The chat model's constructor arguments as users arrive with them from other chat models.

:func:`normalize_init_args` runs before pydantic validation and

* maps other spellings to the field's name (:data:`ALIASES`: ``model_path`` / ``model_id`` /
  ``model_name`` -> ``model``, ``n_ctx`` / ``num_ctx`` / ``max_model_len`` ->
  ``max_context_length``, ``max_new_tokens`` / ``max_completion_tokens`` / ``num_predict`` ->
  ``max_tokens``, ``repeat_penalty`` -> ``repetition_penalty``...); two spellings of one field
  with different values are an error;
* warns (``UserWarning`` naming the argument) about arguments other LangChain chat models take
  that mean nothing for a local model (:data:`NO_EFFECT_ARGS`: ``timeout``, ``max_retries``,
  ``api_key``...) and drops them;
* moves sampling keys found in ``model_kwargs`` to their fields and refuses what it cannot use;
* takes a ``pathlib.Path`` (any ``os.PathLike``) ``model`` as its string;
* refuses ``n`` other than 1 (one generation per prompt) and any other unknown argument with an
  ``InvalidRequestError``;
* checks the values with the same rules as the per-call arguments
  (:func:`~langchain_ascend.chat.checks.check_sampling`, ``langchain_ascend.validation``).

No torch.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from langchain_ascend.chat.checks import check_sampling, stop_list
from langchain_ascend.chat.template import load_chat_template
from langchain_ascend.errors import InvalidArgumentTypeError, InvalidRequestError
from langchain_ascend.validation import (
    check_count,
    check_device,
    check_dtype,
    check_flag,
    check_probability,
)

ALIASES: dict[str, str] = {
    "model_name": "model", "model_path": "model", "model_id": "model",
    "n_ctx": "max_context_length", "num_ctx": "max_context_length",
    "max_model_len": "max_context_length",
    "max_new_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
    "num_predict": "max_tokens", "stop_sequences": "stop",
    "repeat_penalty": "repetition_penalty",
}
"""Other chat models' names of a field -> the field."""

NO_EFFECT_ARGS = frozenset({
    "api_key", "openai_api_key", "base_url", "openai_api_base", "organization",
    "openai_organization", "openai_proxy", "timeout", "request_timeout", "max_retries",
    "default_headers", "default_query", "http_client", "http_async_client", "client_kwargs",
    "keep_alive", "num_gpu", "num_thread", "n_threads", "n_gpu_layers", "n_batch",
    "use_mlock", "use_mmap", "f16_kv", "huggingfacehub_api_token", "n", "logprobs",
    "top_logprobs", "service_tier", "tiktoken_model_name",
})
"""Arguments other LangChain chat models take that a local engine has no use for."""

MODEL_LOADING_KWARGS = frozenset({"revision"})
"""``model_kwargs`` keys the loader uses (for a hub id)."""

_ENGINE_COUNTS = ("max_context_length", "block_size", "num_kv_blocks", "max_batch_size",
                  "max_num_batched_tokens")
_FLAGS = ("enable_prefix_caching", "parse_reasoning", "streaming", "stream_usage")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")


def is_hub_id(model: Any) -> bool:
    """Whether ``model`` names a hub repository rather than a local path."""
    return (isinstance(model, str) and _HUB_ID.match(model) is not None
            and not Path(model).expanduser().exists() and not model.lower().endswith(".gguf"))


def _canonical(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every alias renamed to its field.

    Raises:
        InvalidRequestError: Two spellings of one field with different values.
    """
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in values.items():
        name = ALIASES.get(key, key)
        if name in out and out[name] != value:
            raise InvalidRequestError(
                f"AscendChatModel got {given[name]}={out[name]!r} and {key}={value!r}, two "
                f"spellings of {name!r}; pass one")
        out[name] = value
        given.setdefault(name, key)
    return out


def _check_choices(n: Any) -> None:
    """``n`` (choices per prompt, ChatOpenAI's): 1 or None is what the model does anyway.

    Raises:
        InvalidRequestError: Any other ``n``: code reading ``generations[0][1]`` would fail
            later instead (the server answers ``n > 1`` with a 400, a call's ``n=`` is refused).
    """
    if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n == 1):
        raise InvalidRequestError(
            f"AscendChatModel(n={n!r}) is not supported: one generation per prompt (n=1); for "
            "several samples call batch([prompt] * n) with temperature > 0")


def _warn_no_effect(keys: Collection[str]) -> None:
    for key in sorted(keys):
        warnings.warn(
            f"AscendChatModel ignores {key}=: it is an argument of remote chat models and has "
            "no effect on a local model (accepted so code written for them keeps working)",
            UserWarning, stacklevel=7)  # the caller of AscendChatModel(...)


def _split_model_kwargs(values: dict[str, Any], fields: Collection[str]) -> None:
    """Move sampling keys of ``values["model_kwargs"]`` to their fields; check the rest.

    Raises:
        InvalidArgumentTypeError: ``model_kwargs`` is not a mapping.
        InvalidRequestError: A key the chat model cannot use, a key also given as an argument,
            or ``revision`` for a model that is no hub id.
    """
    extra = values.get("model_kwargs")
    if extra is None:
        values.pop("model_kwargs", None)
        return
    if not isinstance(extra, Mapping):
        raise InvalidArgumentTypeError(
            f"model_kwargs must be a dict, got {type(extra).__name__} {extra!r}")
    kept: dict[str, Any] = {}
    for key, value in extra.items():
        name = ALIASES.get(key, key)
        if key in MODEL_LOADING_KWARGS:
            kept[key] = value
        elif name in fields and name not in ("model", "model_kwargs"):
            if name in values:
                raise InvalidRequestError(
                    f"{name} is given both as an argument and in model_kwargs; pass it once")
            values[name] = value
        else:
            raise InvalidRequestError(
                f"model_kwargs key {key!r} is not supported: model_kwargs takes "
                f"{sorted(MODEL_LOADING_KWARGS)} (loading a hub model) or the chat model's own "
                "sampling arguments")
    if "revision" in kept and not is_hub_id(values.get("model")):
        raise InvalidRequestError(
            f"model_kwargs['revision']={kept['revision']!r} applies to a hub id 'org/name'; "
            f"model={values.get('model')!r} is a local path (it has no revisions)")
    values["model_kwargs"] = kept


def _check_values(raw: Mapping[str, Any]) -> None:
    """Check the values present with the package's rules (typed errors naming the field)."""
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


def normalize_init_args(values: Mapping[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """The constructor's arguments with aliases resolved, no-effect arguments dropped (with a
    warning each), ``model_kwargs`` split and every value checked.

    Args:
        values: The arguments as given.
        fields: The chat model's field names.

    Raises:
        InvalidRequestError: An unknown argument (naming it), conflicting spellings, a bad
            ``model_kwargs`` key, or a value out of range.
        InvalidArgumentTypeError: A value of the wrong type.
    """
    _check_choices(values.get("n"))
    _warn_no_effect([k for k in values if k in NO_EFFECT_ARGS and k not in fields])
    values = _canonical({k: v for k, v in values.items()
                         if k not in NO_EFFECT_ARGS or k in fields})
    unknown = set(values) - set(fields)
    if unknown:
        raise InvalidRequestError(
            f"AscendChatModel got unknown argument(s) {sorted(unknown)}; see "
            "help(AscendChatModel) for the supported ones")
    _split_model_kwargs(values, fields)
    if isinstance(values.get("model"), os.PathLike):  # a pathlib.Path names a local model
        values["model"] = os.fspath(values["model"])
    _check_values(values)  # on the raw values: a bool is refused before pydantic makes it 1
    if "stop" in values:
        values["stop"] = stop_list(values["stop"])
    return values
