"""``AscendChatModel.warm_up``: load the engine, compile its decode step and the grammars a
chat model will ask for, and run one tiny request, so the first real call is not the slow one.
No torch at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema

from langchain_ascend.chat.messages import to_template_tools
from langchain_ascend.chat.prepare import (
    ChatSettings,
    chat_tokenizer,
    prompt_token_ids,
    tool_support_for,
)
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.detokenizer import special_tokens_of
from langchain_ascend.structured.grammars import GrammarSpec
from langchain_ascend.structured.selection import grammar_backend, warm_up_specs


def warm_up_grammar_specs(engine: Any, settings: ChatSettings, tools: Sequence[Any] | None,
                          schemas: Sequence[Any] | None) -> list[GrammarSpec]:
    """The grammars warm-up compiles: what ``json_mode``, ``tool_choice="required"``, each
    named tool, ``tool_choice="none"`` and ``with_structured_output(schema)`` ask for."""
    support = tool_support_for(engine, settings, settings.model)
    return warm_up_specs(
        to_template_tools(tools or ()),
        [convert_to_json_schema(s) for s in schemas or ()],
        fmt=support.fmt,
        special_tokens=set(special_tokens_of(engine.tokenizer)),
    )


def warm_up_engine(engine: Any, settings: ChatSettings, tools: Sequence[Any] | None,
                   schemas: Sequence[Any] | None) -> None:
    """Warm ``engine`` up for a chat model with ``settings`` (see the module docstring)."""
    engine.warmup()
    backend = grammar_backend(engine)
    for spec in warm_up_grammar_specs(engine, settings, tools, schemas):
        backend.compile(spec)
    prompt = prompt_token_ids(
        chat_tokenizer(engine, settings, settings.model),
        [{"role": "user", "content": "Hi"}], None, settings.chat_template_kwargs,
    )[0]
    engine.generate(prompt, SamplingParams(max_tokens=1))
