"""``AscendChatModel.warm_up``: load the engine, compile its decode step and the grammars a
chat model will ask for, and run one tiny request, so the first real call is not the slow one.
No torch at import.

The engine's own warm-up (a prefill, a decode step, the compile decision) runs once per engine:
a second ``warm_up`` (say, with tools, after a plain one) only adds its grammars and request.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage

from langchain_ascend.chat.messages import to_template_tools
from langchain_ascend.chat.prepare import (
    ChatSettings,
    build_prompt,
    chat_tokenizer,
    prompt_token_ids,
    tool_support_for,
)
from langchain_ascend.chat.tool_schemas import json_schema
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
        [json_schema(s) for s in schemas or ()],
        fmt=support.fmt,
        special_tokens=set(special_tokens_of(engine.tokenizer)),
    )


def call_grammar_specs(calls: Sequence[Mapping[str, Any]], settings: ChatSettings,
                       engine_for: Callable[[str], Any]) -> list[GrammarSpec]:
    """The grammars of calls made with these arguments (``tools``, ``tool_choice``,
    ``parallel_tool_calls``, ``response_format``... as a ``bind_tools`` binding holds them):
    picked by the request path itself, so each is exactly the one such a call compiles.
    Calls without a grammar (``tool_choice="auto"``) add none."""
    specs: dict[tuple[str, str], GrammarSpec] = {}
    for kwargs in calls:
        spec = build_prompt([HumanMessage("Hi")], kwargs, settings, engine_for).spec
        if spec is not None:
            specs.setdefault(spec.cache_key, spec)
    return list(specs.values())


#: Engines whose own warm-up has run (see the module docstring).
_warmed_engines: weakref.WeakSet[Any] = weakref.WeakSet()


def warm_up_engine(engine: Any, settings: ChatSettings, tools: Sequence[Any] | None,
                   schemas: Sequence[Any] | None, *,
                   calls: Sequence[Mapping[str, Any]] = (),
                   engine_for: Callable[[str], Any] | None = None) -> None:
    """Warm ``engine`` up for a chat model with ``settings`` (see the module docstring);
    ``calls``: further call arguments whose grammars to compile (:func:`call_grammar_specs`,
    rendered through ``engine_for``)."""
    if engine not in _warmed_engines:
        engine.warmup()
        _warmed_engines.add(engine)
    backend = grammar_backend(engine)
    specs = warm_up_grammar_specs(engine, settings, tools, schemas)
    if calls:
        specs += call_grammar_specs(calls, settings, engine_for or (lambda _name: engine))
    for spec in specs:
        backend.compile(spec)
    prompt = prompt_token_ids(
        chat_tokenizer(engine, settings, settings.model),
        [{"role": "user", "content": "Hi"}], None, settings.chat_template_kwargs,
    )[0]
    engine.generate(prompt, SamplingParams(max_tokens=1))
