"""Compiled grammars kept on disk: a second backend (a second process) reads the grammar back
instead of compiling it, and masks tokens exactly as the compiled one does; a corrupt file is
removed and compiled again; an unwritable folder only means no cache."""

from __future__ import annotations

import os

import pytest
import torch
import xgrammar as xgr
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from langchain_ascend.structured import grammar_cache
from langchain_ascend.structured.grammar_cache import GrammarDiskCache
from langchain_ascend.structured.grammars import json_schema_grammar, tool_call_grammar
from langchain_ascend.structured.xgrammar_backend import GrammarBackend


class Forecast(BaseModel):
    """Forecast for a city."""

    city: str = Field(description="City name")
    days: int = Field(ge=1, le=10)


SPEC = tool_call_grammar([convert_to_openai_tool(Forecast)], fmt="hermes")


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


def new_backend(tokenizer, folder=None) -> GrammarBackend:
    """A fresh backend (as a new process builds one), its grammars kept in ``folder``."""
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    probe = GrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=stops,
                           disk_cache=False)
    fingerprint = probe_fingerprint(probe)
    cache = GrammarDiskCache(fingerprint, folder) if folder is not None else False
    return GrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=stops,
                          disk_cache=cache)


def probe_fingerprint(backend: GrammarBackend) -> str:
    return grammar_cache.tokenizer_fingerprint(
        backend.decoded_vocab, vocab_size=backend.vocab_size,
        stop_token_ids=backend.stop_token_ids)


def masks_along(backend: GrammarBackend, text: str, tokenizer) -> list[list[bool]]:
    """The allowed-token mask at each step of writing ``text`` under ``SPEC``."""
    constraint = backend.new_constraint(SPEC, max_tokens=200)
    masks = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        logits = torch.zeros(backend.vocab_size)  # (V,)
        constraint.mask_logits(logits)
        masks.append((logits > float("-inf")).tolist())
        constraint.accept_token(token)
        assert constraint.rejected_token is None
    return masks


def refuse_compiles(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("compiled although the grammar was on disk")

    for name in ("compile_structural_tag", "compile_json_schema"):
        monkeypatch.setattr(xgr.GrammarCompiler, name, refuse)


def test_a_second_backend_reads_the_grammar_back_with_the_same_masks(
        tokenizer, tmp_path, monkeypatch):
    first = new_backend(tokenizer, tmp_path)
    first.compile(SPEC)
    assert first.disk_cache.path_for(SPEC).is_file()
    call = '<tool_call>\n{"name": "Forecast", "arguments": {"city": "Oslo", "days": 3}}'
    expected = masks_along(first, call, tokenizer)

    refuse_compiles(monkeypatch)
    second = new_backend(tokenizer, tmp_path)
    assert not second.is_cached(SPEC)
    assert masks_along(second, call, tokenizer) == expected
    assert second.is_cached(SPEC)


def test_a_corrupt_file_is_removed_and_compiled_again(tokenizer, tmp_path):
    backend = new_backend(tokenizer, tmp_path)
    path = backend.disk_cache.path_for(SPEC)
    path.write_text('{"not": "a grammar"', encoding="utf-8")
    compiled = backend.compile(SPEC)
    assert compiled is not None
    reread = xgr.CompiledGrammar.deserialize_json(path.read_text("utf-8"),
                                                  backend.tokenizer_info)
    assert str(reread.grammar) == str(compiled.grammar)


def test_another_tokenizer_or_spec_gets_another_file(tokenizer, tmp_path):
    backend = new_backend(tokenizer, tmp_path)
    other_spec = json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert backend.disk_cache.path_for(SPEC) != backend.disk_cache.path_for(other_spec)
    other = GrammarDiskCache(backend.disk_cache.fingerprint + "x", tmp_path)
    assert other.path_for(SPEC) != backend.disk_cache.path_for(SPEC)


def test_an_unwritable_folder_only_means_no_cache(tokenizer, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    backend = new_backend(tokenizer, blocker / "grammars")  # a folder under a file
    assert backend.compile(SPEC) is not None
    assert backend.disk_cache.store(SPEC, "{}") is False


def test_only_the_newest_files_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(grammar_cache, "MAX_FILES", 2)
    cache = GrammarDiskCache("f", tmp_path)
    specs = [json_schema_grammar({"type": "object", "title": f"t{i}"}) for i in range(4)]
    for number, spec in enumerate(specs):
        assert cache.store(spec, "{}")
        stamp = 10**18 + number * 10**9
        os.utime(cache.path_for(spec), ns=(stamp, stamp))
    kept = sorted(p.name for p in tmp_path.glob("*" + grammar_cache.SUFFIX))
    assert kept == sorted(cache.path_for(s).name for s in specs[-2:])


def test_the_default_folder_follows_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(grammar_cache.CACHE_ENV_VAR, str(tmp_path / "g"))
    assert GrammarDiskCache("f").folder == (tmp_path / "g").resolve()
