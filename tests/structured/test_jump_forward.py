"""Grammar jump-forward: the text a grammar forces is appended as the tokenizer's own tokens.

Driven by random logits (no model), as in ``test_constrained_decoding``: between sampled
tokens the constraint's ``jump_forward`` appends the forced tokens, and the reply must still be
valid, stay within ``max_tokens``, and spell the forced text with the tokenizer's tokens.
"""

from __future__ import annotations

import pytest
import torch
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from langchain_ascend.chat.tool_parsers import parse_tool_calls
from langchain_ascend.structured import json_schema_grammar, tool_call_grammar
from langchain_ascend.structured.xgrammar_backend import get_grammar_backend


class Weather(BaseModel):
    """Weather for a city."""

    city: str = Field(description="City name")
    days: int = Field(ge=1, le=10)


TOOLS = [convert_to_openai_tool(Weather)]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_path):
    return AutoTokenizer.from_pretrained(tiny_qwen2_path)


@pytest.fixture(scope="module")
def backend(tokenizer):
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"),
             tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    return get_grammar_backend(tokenizer, vocab_size=len(tokenizer) + 64, stop_token_ids=stops)


def generate_with_jumps(backend, spec, *, seed, max_tokens):
    """Sample from random logits, jumping forward after every token; (ids, jumps, passes)."""
    gen = torch.Generator().manual_seed(seed)
    constraint = backend.new_constraint(spec, max_tokens=max_tokens)
    ids: list[int] = []
    jumps: list[list[int]] = []
    passes = 0
    forced = constraint.jump_forward(max_tokens - 1)  # the reply may start with forced text
    while True:
        if forced:
            jumps.append(forced)
            ids += forced
        passes += 1
        logits = torch.randn(backend.vocab_size, generator=gen) * 3.0  # (V,)
        constraint.mask_logits(logits)
        token = int(logits.argmax())
        constraint.accept_token(token)
        assert constraint.rejected_token is None
        if token in backend.stop_token_ids:
            return ids, jumps, passes
        ids.append(token)
        assert len(ids) < max_tokens
        forced = constraint.jump_forward(max_tokens - len(ids) - 1)


def test_a_named_tool_call_jumps_over_its_fixed_text(backend, tokenizer):
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name="Weather")
    for seed in range(5):
        ids, jumps, passes = generate_with_jumps(backend, spec, seed=seed, max_tokens=80)
        (call,) = parse_tool_calls(tokenizer.decode(ids), "hermes").tool_calls
        assert call["name"] == "Weather"
        Weather.model_validate(call["args"])
        assert jumps, "the tool name and the JSON keys are forced"
        assert sum(map(len, jumps)) + passes - 1 == len(ids)
        # the forced name is in one jump, as the tokenizer spells it
        joined = [tokenizer.decode(j) for j in jumps]
        assert any('"Weather"' in text for text in joined), joined
        for jump in jumps:
            text = tokenizer.decode(jump)
            assert tokenizer.encode(text, add_special_tokens=False)[:len(jump)] == jump


def test_structured_output_keys_are_forced(backend, tokenizer):
    spec = json_schema_grammar(Weather.model_json_schema())
    ids, jumps, passes = generate_with_jumps(backend, spec, seed=3, max_tokens=60)
    Weather.model_validate_json(tokenizer.decode(ids))
    assert passes < len(ids)


def test_jumps_respect_the_limit(backend):
    spec = tool_call_grammar(TOOLS, fmt="hermes", tool_name="Weather")
    assert backend.new_constraint(spec, max_tokens=80).jump_forward(0) == []
    full = backend.new_constraint(spec, max_tokens=80).jump_forward(50)
    limited = backend.new_constraint(spec, max_tokens=80).jump_forward(2)
    assert len(full) > 2 and limited == full[:2]
