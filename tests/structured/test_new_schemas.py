"""Tool schemas that change from call to call: compiled once per content, off the request's path.

The compile of a new schema runs on the backend's compile thread and the constraint waits for
it only at its first mask (the first sampled token); before that a forced call's opening text
is appended from the spec alone. These tests check that order structurally, with the compile
held back by a gate, not by timing.
"""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from langchain_ascend.chat.tool_parsers import parse_tool_calls
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured import GrammarSpec, json_schema_grammar, tool_call_grammar
from langchain_ascend.structured.grammars import forced_prefix_of
from langchain_ascend.structured.xgrammar_backend import GrammarBackend
from langchain_ascend.tool_formats.hermes import call_prefix


def new_tool(i: int) -> dict:
    """A tool no other test uses, of a shape that varies with ``i`` (nested objects, enums,
    arrays, optional fields)."""
    properties: dict = {f"city_{i}": {"type": "string"},
                        "unit": {"type": "string", "enum": ["c", "f", f"k{i}"]}}
    if i % 2:
        properties["stops"] = {"type": "array", "items": {"type": "integer"}}
    if i % 3 == 0:
        properties["who"] = {"type": "object", "properties": {"name": {"type": "string"},
                                                             "vip": {"type": "boolean"}},
                             "required": ["name"]}
    return {"type": "function", "function": {
        "name": f"plan_trip_{i}", "description": "Plan a trip.",
        "parameters": {"type": "object", "properties": properties,
                       "required": [f"city_{i}"]}}}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@pytest.fixture
def backend(tokenizer) -> GrammarBackend:
    """A backend of its own per test (so its counts start at zero)."""
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return GrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=stops)


class GatedCompiler:
    """The backend's compiler, holding every compile until :attr:`gate` is set."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.started = threading.Event()

    def compile_structural_tag(self, source):
        self.started.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return self.inner.compile_structural_tag(source)


def forced_spec(tool: dict) -> GrammarSpec:
    return tool_call_grammar([tool], fmt="hermes", tool_name=tool["function"]["name"])


def finish(constraint, backend, *, seed: int, max_tokens: int) -> list[int]:
    """Sample the rest of a reply from random logits under ``constraint``."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(max_tokens):
        logits = torch.randn(backend.vocab_size, generator=gen) * 3.0  # (V,)
        constraint.mask_logits(logits)
        token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
        constraint.accept_token(token)
        assert constraint.rejected_token is None
        if token in backend.stop_token_ids:
            return ids
        ids.append(token)
    raise AssertionError("the reply did not end within its budget")


def test_forced_prefix_is_the_calls_opening_text():
    tool = new_tool(1)
    assert forced_spec(tool).forced_prefix == call_prefix("plan_trip_1")
    # Markers that are special tokens are written as tokens: nothing is forced as text.
    special = tool_call_grammar([tool], fmt="hermes", tool_name="plan_trip_1",
                                special_tokens={"<tool_call>", "</tool_call>"})
    assert special.forced_prefix == ""
    # A free choice between tools forces nothing; JSON grammars carry no prefix.
    assert tool_call_grammar([tool, new_tool(2)], fmt="hermes").forced_prefix == ""
    assert json_schema_grammar({"type": "object"}).forced_prefix == ""
    assert forced_prefix_of({"type": "sequence", "elements": [
        {"type": "const_string", "value": "a"}, {"type": "const_string", "value": "b"},
        {"type": "tag", "begin": "c", "content": {"type": "any_text"}, "end": "d"},
        {"type": "const_string", "value": "e"}]}) == "abc"


def test_identical_schema_content_reuses_the_compiled_grammar(backend):
    first = backend.compile(forced_spec(new_tool(3)))
    again = forced_spec(json.loads(json.dumps(new_tool(3))))  # equal content, new objects
    assert backend.compile(again) is first
    assert backend.num_compiles == 1
    constraint = backend.new_constraint(again, max_tokens=80)
    assert backend.num_compiles == 1 and constraint.has_matcher is False
    backend.compile(forced_spec(new_tool(4)))
    assert backend.num_compiles == 2


def test_the_compile_is_awaited_only_at_the_first_mask(backend, tokenizer):
    gated = GatedCompiler(backend._compiler)
    backend._compiler = gated
    tool = new_tool(6)
    spec = forced_spec(tool)
    constraint = backend.new_constraint(spec, max_tokens=120)  # returns with the compile held
    assert gated.started.wait(timeout=60)  # running on the compile thread
    # What the scheduler asks before the prompt's prefill needs no grammar:
    prefix_ids = constraint.jump_forward(64)
    assert tokenizer.decode(prefix_ids) == spec.forced_prefix[:len(tokenizer.decode(prefix_ids))]
    assert len(prefix_ids) > 3
    assert constraint.is_terminated() is False
    assert constraint.has_matcher is False and not gated.gate.is_set()
    # The first mask (the first sampled token) waits for the compile.
    masked = threading.Thread(target=constraint.mask_logits,
                              args=(torch.zeros(backend.vocab_size),))
    masked.start()
    masked.join(timeout=0.5)
    assert masked.is_alive() and constraint.has_matcher is False
    gated.gate.set()
    masked.join(timeout=60)
    assert not masked.is_alive() and constraint.has_matcher
    # The prefix tokens were replayed into the matcher; the reply is a valid call.
    rest = finish(constraint, backend, seed=6, max_tokens=110)
    text = tokenizer.decode(prefix_ids + rest)
    out = parse_tool_calls(text, "hermes")
    assert [c["name"] for c in out.tool_calls] == ["plan_trip_6"], text
    jsonschema.validate(out.tool_calls[0]["args"], tool["function"]["parameters"])


def test_a_bad_schema_fails_at_once_not_in_the_engine(backend):
    with pytest.raises(InvalidRequestError, match="cannot build a grammar"):
        backend.new_constraint(GrammarSpec("json_schema", '{"type": "no-such-type"}'),
                               max_tokens=10)
    assert backend.num_compiles == 0


@pytest.mark.parametrize("seed", range(4))
def test_forced_calls_with_new_schemas_stay_valid(backend, tokenizer, seed):
    for i in range(10 + 5 * seed, 15 + 5 * seed):
        tool = new_tool(i)
        constraint = backend.new_constraint(forced_spec(tool), max_tokens=120)
        forced_ids = constraint.jump_forward(64)  # as the scheduler does at admission
        text = tokenizer.decode(forced_ids + finish(constraint, backend, seed=i,
                                                    max_tokens=120 - len(forced_ids)))
        out = parse_tool_calls(text, "hermes")
        assert [c["name"] for c in out.tool_calls] == [tool["function"]["name"]], text
        assert out.invalid_tool_calls == [] and out.content == ""
        jsonschema.validate(out.tool_calls[0]["args"], tool["function"]["parameters"])
