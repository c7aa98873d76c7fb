"""Grammar specs and the xgrammar constraint, driven by random logits (no model).

Random logits stand in for a random-weight model: whatever the "model" prefers, the constraint
must make every sampled reply valid — and finished within ``max_tokens``.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
import torch
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from langchain_ascend.chat.tool_parsers import parse_tool_calls
from langchain_ascend.chat.tool_schemas import json_schema, openai_tool
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.structured import (
    GrammarSpec,
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from langchain_ascend.structured.xgrammar_backend import (
    GrammarBackend,
    get_grammar_backend,
    pack_mask,
    unpack_mask,
)


class Weather(BaseModel):
    """Weather for a city."""

    city: str = Field(description="City name")
    unit: Literal["celsius", "fahrenheit"] = "celsius"
    days: int = Field(ge=1, le=10)


class Address(BaseModel):
    street: str
    zip_code: int


class Person(BaseModel):
    """A person."""

    name: str
    age: int
    tags: list[str] = []
    address: Address
    nickname: str | None = None


def no_args() -> str:
    """Takes nothing."""
    return ""


TOOLS = [convert_to_openai_tool(Weather), convert_to_openai_tool(no_args)]
PAD = 64  # model vocabulary padded past the tokenizer's, like many real checkpoints


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@pytest.fixture(scope="module")
def backend(tokenizer) -> GrammarBackend:
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"),
             tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    return get_grammar_backend(tokenizer, vocab_size=len(tokenizer) + PAD, stop_token_ids=stops)


def _generate(backend, spec, *, seed, max_tokens, temperature=1.0, scale=3.0):
    """Sample token by token from random logits under the constraint; return (ids, stopped)."""
    gen = torch.Generator().manual_seed(seed)
    constraint = backend.new_constraint(spec, max_tokens=max_tokens)
    ids = []
    for _ in range(max_tokens):
        logits = torch.randn(backend.vocab_size, generator=gen) * scale  # (V,)
        constraint.mask_logits(logits)
        if temperature == 0:
            token = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=gen))
        constraint.accept_token(token)
        assert constraint.rejected_token is None
        if token in backend.stop_token_ids:
            return ids, True
        ids.append(token)
    return ids, False


# --- pure spec builders -------------------------------------------------------------------


def test_specs_keep_property_order_and_are_cache_keys():
    a = json_schema_grammar({"type": "object", "properties": {"b": {}, "a": {}}})
    b = json_schema_grammar({"type": "object", "properties": {"b": {}, "a": {}}})
    assert a == b and a.cache_key == b.cache_key
    assert a.source.index('"b"') < a.source.index('"a"')  # declared order, not sorted
    assert json_object_grammar().kind == "json_object"
    with pytest.raises(InvalidRequestError):
        json_schema_grammar("not a schema")  # type: ignore[arg-type]


def test_properties_are_written_in_declared_order(backend, tokenizer):
    ids, _ = _generate(backend, json_schema_grammar(convert_to_json_schema(Person)), seed=0,
                       max_tokens=60)
    assert list(json.loads(tokenizer.decode(ids)))[:2] == ["name", "age"]


def test_tool_grammar_forces_the_format_and_only_the_named_tool():
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name="Weather")
    tag = json.loads(spec.source)["format"]
    assert tag["type"] == "tags_with_separator" and tag["stop_after_first"] is True
    (only,) = tag["tags"]
    assert only["begin"] == '<tool_call>\n{"name": "Weather", "arguments": '
    assert only["end"] == "}\n</tool_call>"
    assert only["content"]["excludes"] == ["<tool_call>", "</tool_call>"]
    with pytest.raises(InvalidRequestError, match="not one of the tools"):
        tool_call_grammar(TOOLS, fmt="hermes", tool_name="nope")
    with pytest.raises(InvalidRequestError, match="no tools"):
        tool_call_grammar([], fmt="hermes")


def test_mistral_marker_is_a_single_token_when_the_vocab_has_it():
    as_token = tool_call_grammar(TOOLS, fmt="mistral", special_tokens={"[TOOL_CALLS]"})
    assert json.loads(as_token.source)["format"]["elements"][0] == {
        "type": "token", "token": "[TOOL_CALLS]"}
    assert as_token.required_special_tokens == ("[TOOL_CALLS]",)
    as_text = tool_call_grammar(TOOLS, fmt="mistral")
    assert json.loads(as_text.source)["format"]["elements"][0]["type"] == "const_string"


def test_pack_and_unpack_are_inverse():
    mask = torch.rand(1000, generator=torch.Generator().manual_seed(0)) > 0.5
    packed = pack_mask(mask.numpy())
    assert packed.shape == (32,)
    assert (unpack_mask(packed, 1000) == mask.numpy()).all()


# --- the constraint -----------------------------------------------------------------------


def test_compiled_grammars_and_backends_are_shared(backend, tokenizer):
    first = backend.compile(json_schema_grammar(convert_to_json_schema(Person)))
    assert backend.compile(json_schema_grammar(convert_to_json_schema(Person))) is first
    again = get_grammar_backend(tokenizer, vocab_size=backend.vocab_size,
                                stop_token_ids=list(reversed(backend.stop_token_ids)))
    assert again is backend


def test_bad_schema_is_a_typed_error(backend):
    """Its message says what is wrong with the schema, without the compiler's C++ place."""
    with pytest.raises(InvalidRequestError, match="cannot build a grammar") as caught:
        backend.compile(GrammarSpec("json_schema", '{"type": "no-such-type"}'))
    message = str(caught.value)
    assert "no-such-type" in message and ".cc:" not in message and "/project" not in message


def test_masks_special_tokens_padding_and_leaves_only_grammar_tokens(backend, tokenizer):
    constraint = backend.new_constraint(json_object_grammar(), max_tokens=500)
    logits = torch.zeros(backend.vocab_size)
    with torch.inference_mode():  # the engine's rows are inference tensors
        logits = logits.clone()
    constraint.mask_logits(logits)
    allowed = torch.isfinite(logits).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([i]).startswith("{") for i in allowed)
    assert torch.isinf(logits[len(tokenizer):]).all()  # lm_head padding rows
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert logits[im_start] == float("-inf")


@pytest.mark.parametrize("max_tokens", [64, 100])
def test_structured_output_schema_valid_for_20_seeds(backend, tokenizer, max_tokens):
    spec = json_schema_grammar(convert_to_json_schema(Person))
    for seed in range(20):
        ids, stopped = _generate(backend, spec, seed=seed, max_tokens=max_tokens)
        assert stopped, f"seed {seed} did not finish within {max_tokens} tokens"
        Person.model_validate(json.loads(tokenizer.decode(ids)))


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_forced_tool_calls_parse_and_match_schemas_for_20_seeds(backend, tokenizer, fmt):
    spec = tool_call_grammar(TOOLS, fmt=fmt, parallel=True)
    for seed in range(20):
        ids, stopped = _generate(backend, spec, seed=seed, max_tokens=100)
        assert stopped
        out = parse_tool_calls(tokenizer.decode(ids), fmt)
        assert out.invalid_tool_calls == [] and out.content == ""
        assert out.tool_calls
        for call in out.tool_calls:
            if call["name"] == "Weather":
                Weather.model_validate(call["args"])
            else:
                assert call == {**call, "name": "no_args", "args": {}}


def test_named_tool_gives_exactly_one_call_of_that_tool_even_greedy(backend, tokenizer):
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name="Weather")
    for seed in range(5):
        ids, stopped = _generate(backend, spec, seed=seed, max_tokens=60, temperature=0)
        assert stopped
        (call,) = parse_tool_calls(tokenizer.decode(ids), "hermes").tool_calls
        assert call["name"] == "Weather"
        Weather.model_validate(call["args"])


def test_greedy_text_does_not_depend_on_max_tokens_while_it_fits(backend):
    """The budget guard steps in only where closing would no longer fit: a greedy reply that
    ends on its own within the budget is the same reply under any budget it fits in (with
    forced bytes ahead, the model's own split of them stands)."""
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name="Weather")
    checked = 0
    for seed in range(14):
        ids, stopped = _generate(backend, spec, seed=seed, max_tokens=400, temperature=0)
        if not stopped or len(ids) > 360:
            continue  # a reply the budget shaped
        checked += 1
        for budget in (len(ids) + 17, len(ids) + 64):
            assert _generate(backend, spec, seed=seed, max_tokens=budget,
                             temperature=0) == (ids, True), (seed, budget)
    assert checked >= 10


class Parcel(BaseModel):
    """Items to search: an array of objects, an enum and free text."""

    date: int
    items: list[Item]


class Item(BaseModel):
    """One item."""

    notes: str | None = None
    priority: Literal["fahrenheit", "blue", "celsius"]


def test_greedy_forced_calls_close_at_every_budget(backend, tokenizer):
    """Near the budget the guard lets the model's own split of forced bytes stand, and still
    closes every call in time (a token reaching past the forced bytes, such as the start of
    another key, is checked like any other choice)."""
    Parcel.model_rebuild()
    spec = tool_call_grammar([openai_tool(Parcel)], fmt="hermes", tool_name="Parcel")
    for seed in range(4):
        for budget in range(40, 100, 3):
            ids, stopped = _generate(backend, spec, seed=seed, max_tokens=budget,
                                     temperature=0, scale=1.0)
            assert stopped, (seed, budget, tokenizer.decode(ids))
            (call,) = parse_tool_calls(tokenizer.decode(ids), "hermes").tool_calls
            Parcel.model_validate(call["args"])


class Node(BaseModel):
    """A tree node."""

    value: int
    children: list[Node] = []


def test_a_self_referencing_schema_gives_valid_trees(backend, tokenizer):
    """A class that refers to itself keeps its ``$ref`` (``chat.tool_schemas``), so every
    structured reply and forced call is a valid tree, however deep."""
    output = json_schema_grammar(json_schema(Node))
    call = tool_call_grammar([openai_tool(Node)], fmt="hermes", tool_name="Node")
    for seed in range(8):
        ids, stopped = _generate(backend, output, seed=seed, max_tokens=120)
        assert stopped
        Node.model_validate(json.loads(tokenizer.decode(ids)))
        ids, stopped = _generate(backend, call, seed=seed, max_tokens=160)
        assert stopped
        (parsed,) = parse_tool_calls(tokenizer.decode(ids), "hermes").tool_calls
        Node.model_validate(parsed["args"])


def test_json_mode_gives_a_json_object(backend, tokenizer):
    for seed in range(10):
        ids, stopped = _generate(backend, json_object_grammar(), seed=seed, max_tokens=40)
        assert stopped
        assert isinstance(json.loads(tokenizer.decode(ids)), dict)


def test_budget_guard_only_steps_in_near_the_end(backend):
    spec = json_schema_grammar(convert_to_json_schema(Person))
    constraint = backend.new_constraint(spec, max_tokens=2000)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(backend.vocab_size, generator=gen)
        constraint.mask_logits(logits)
        constraint.accept_token(int(logits.argmax()))
    assert not constraint.closing  # 1,980 tokens left: the model writes freely


def test_a_token_outside_the_grammar_ends_the_request(backend, tokenizer):
    constraint = backend.new_constraint(json_object_grammar(), max_tokens=50)
    constraint.accept_token(tokenizer.encode("hello")[0])
    assert constraint.rejected_token is not None
    assert constraint.is_terminated()


def test_no_tool_call_grammar_forbids_the_marker_and_allows_stopping(backend, tokenizer):
    from langchain_ascend.structured import no_tool_call_grammar

    spec = no_tool_call_grammar("hermes", set(tokenizer.all_special_tokens))
    assert spec.free_text
    constraint = backend.new_constraint(spec, max_tokens=50)
    logits = torch.zeros(backend.vocab_size)
    constraint.mask_logits(logits)
    assert logits[tokenizer.convert_tokens_to_ids("<tool_call>")] == float("-inf")
    assert logits[backend.stop_token_ids[0]] == 0  # the reply may end anywhere
    assert logits[tokenizer.encode(" weather")[0]] == 0  # ordinary text is untouched
    for token in tokenizer.encode("<tool_call"):  # spelled out piece by piece...
        constraint.accept_token(token)
    assert constraint.rejected_token is None
    logits = torch.zeros(backend.vocab_size)
    constraint.mask_logits(logits)
    assert logits[tokenizer.convert_tokens_to_ids(">")] == float("-inf")  # ...still refused


def test_backend_and_grammars_share_one_special_token_map(backend, tokenizer):
    from langchain_ascend.structured import special_tokens_of

    special = special_tokens_of(tokenizer)
    assert backend.special_tokens == special
    assert special["<|im_end|>"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert set(special) == set(tokenizer.all_special_tokens)



def _pending_bytes_sampler(backend, allowed_ids, gen, near_the_end):
    """An adversarial sampler: near the end of the budget (and now and then before) a token
    whose last byte starts a 4-byte character whenever one is allowed (3 continuation bytes
    then cost up to 3 more tokens to close), else any allowed token."""
    ids = allowed_ids.tolist()
    costly = [t for t in ids if backend.decoded_vocab[t][-1:] >= b"\xf0"]
    if costly and (near_the_end or float(torch.rand(1, generator=gen)) < 0.05):
        ids = costly
    return ids[int(torch.randint(len(ids), (1,), generator=gen))]


@pytest.mark.parametrize(("tool_name", "max_tokens", "seeds"), [
    ("Weather", 40, range(24, 30)), ("Weather", 48, range(4)), ("Weather", 64, range(6, 12)),
    (None, 48, range(4))])
def test_budget_guard_closes_even_when_a_character_leaves_bytes_pending(
        backend, tokenizer, tool_name, max_tokens, seeds):
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name=tool_name, parallel=False)
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        constraint = backend.new_constraint(spec, max_tokens=max_tokens)
        ids = []
        for step in range(max_tokens):
            token = _pending_bytes_sampler(backend, constraint.allowed_token_ids(), gen,
                                           near_the_end=step >= max_tokens - 16)
            constraint.accept_token(token)
            assert constraint.rejected_token is None
            if token in backend.stop_token_ids:
                break
            ids.append(token)
        else:
            pytest.fail(f"seed {seed}: cut at max_tokens={max_tokens}: {tokenizer.decode(ids)!r}")
        assert parse_tool_calls(tokenizer.decode(ids), "hermes").tool_calls
