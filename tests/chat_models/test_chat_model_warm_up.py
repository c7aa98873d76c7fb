"""warm_up(calls=...) compiles exactly the grammars those calls ask for (the demo's agent binds
parallel_tool_calls=False, whose forced-call grammar warm_up(tools=) does not compile), and the
engine's own warm-up runs once per engine however often warm_up is called."""

from __future__ import annotations

import xgrammar as xgr
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from langchain_ascend.chat.warm_up import call_grammar_specs, warm_up_engine
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.structured.selection import grammar_backend


@tool
def get_tide(harbour: str) -> str:
    """High and low tide times for a harbour (used by this file only: a grammar new to the
    process)."""
    return f"{harbour}: high 06:10, low 12:25"


def test_calls_warm_up_compiles_what_those_calls_ask_for(tiny_qwen2_path, monkeypatch):
    model = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", temperature=0,
                            max_tokens=24)
    forced = model.bind_tools([get_tide], tool_choice="required", parallel_tool_calls=False)
    free = model.bind_tools([get_tide], tool_choice="none")
    chosen = model.bind_tools([get_tide])  # "auto": no grammar
    calls = [forced.kwargs, free.kwargs, chosen.kwargs]
    specs = call_grammar_specs(calls, model._settings(), model._engine_for)
    assert len(specs) == 2
    assert len(call_grammar_specs([*calls, forced.kwargs], model._settings(),
                                  model._engine_for)) == 2  # the same grammar once
    backend = grammar_backend(model._engine_for())
    tide = [spec for spec in specs if "get_tide" in spec.source]
    assert len(tide) == 1 and not backend.is_cached(tide[0])  # ("none" names no tool)
    model.warm_up(calls=calls)
    assert all(backend.is_cached(spec) for spec in specs)

    def refuse(*_args, **_kwargs):
        raise AssertionError("the forced call compiled a grammar warm-up should have")

    monkeypatch.setattr(xgr.GrammarCompiler, "compile_structural_tag", refuse)
    reply = forced.invoke([HumanMessage("Tides in Brest?")])
    assert reply.response_metadata["finish_reason"] in ("tool_calls", "length")
    assert model.bind_tools([get_tide], tool_choice="none").invoke("Tides?").tool_calls == []


class CountingEngine:
    """The real engine, counting its own warm-ups."""

    def __init__(self, engine):
        self.engine, self.warmups = engine, 0

    def warmup(self):
        self.warmups += 1
        self.engine.warmup()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_the_engine_warms_up_once(tiny_chat):
    settings = tiny_chat._settings()
    engine = CountingEngine(tiny_chat._engine_for())
    warm_up_engine(engine, settings, None, None)
    warm_up_engine(engine, settings, None, None)
    assert engine.warmups == 1
    other = CountingEngine(tiny_chat._engine_for())
    warm_up_engine(other, settings, None, None)
    assert other.warmups == 1
