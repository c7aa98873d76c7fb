"""What LangChain and LangSmith read about a chat model: its identifying parameters and the
``ls_*`` tracing parameters of a call (the model's readable name, never a path). No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models.chat_models import LangSmithParams

from langchain_ascend.chat.model_names import readable_model_name

IDENTIFYING_FIELDS = ("model", "device", "dtype", "max_tokens", "temperature", "top_p", "top_k",
                      "min_p", "seed", "stop", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "reasoning", "chat_template_kwargs")


def identifying_params(chat: Any, chat_template: str | None) -> dict[str, Any]:
    """The fields that make two chat models answer differently, and the template text."""
    return {**{name: getattr(chat, name) for name in IDENTIFYING_FIELDS},
            "chat_template": chat_template}


def ls_params(chat: Any, stop: Sequence[str] | None, kwargs: Mapping[str, Any],
              ) -> LangSmithParams:
    """LangSmith's parameters of a call with ``kwargs`` (a per-call ``model=`` named by its
    own readable name)."""
    model = kwargs.get("model")
    own = not (isinstance(model, str) and model and model != chat.model)
    params = LangSmithParams(
        ls_provider="ascend",
        ls_model_name=(readable_model_name(chat.model, chat.gguf_file) if own
                       else readable_model_name(model)),
        ls_model_type="chat",
    )
    temperature = kwargs.get("temperature", chat.temperature)
    if isinstance(temperature, (int, float)):
        params["ls_temperature"] = float(temperature)
    max_tokens = kwargs.get("max_tokens", chat.max_tokens)
    if isinstance(max_tokens, int):
        params["ls_max_tokens"] = max_tokens
    stops = stop if stop is not None else chat.stop
    if stops:
        params["ls_stop"] = list(stops)
    return params
