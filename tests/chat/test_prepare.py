"""Request preparation steps, tested directly (pure, no model), and one prepared request."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from langchain_ascend.chat.prepare import (
    CALL_KWARGS,
    ChatSettings,
    check_call_kwargs,
    generation_defaults,
    max_tokens_for,
    normalize_tool_choice,
    prepare_request,
    sampling_values,
    template_kwargs_for,
)
from langchain_ascend.errors import InvalidRequestError, PromptTooLongError
from langchain_ascend.structured import json_object_grammar, no_tool_call_grammar

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
          "frequency_penalty": 0.0, "repetition_penalty": 1.0}


@pytest.mark.parametrize(("choice", "expected"), [
    (None, "auto"), ("auto", "auto"), (False, "none"), ("none", "none"), (True, "required"),
    ("required", "required"), ("any", "required"), ("add", "add"),
    ({"type": "function", "function": {"name": "add"}}, "add"), ({"name": "add"}, "add"),
    ({"type": "any"}, "required"), ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "mul"}, "mul"),
])
def test_tool_choice_spellings(choice, expected):
    assert normalize_tool_choice(choice, ["add", "mul"]) == expected


def test_bad_tool_choices_are_typed_errors():
    with pytest.raises(InvalidRequestError, match="'sub', which is not one of the bound tools"):
        normalize_tool_choice("sub", ["add"])
    with pytest.raises(InvalidRequestError, match="unsupported tool_choice"):
        normalize_tool_choice({"type": "function"}, ["add"])
    with pytest.raises(InvalidRequestError, match="unsupported tool_choice"):
        normalize_tool_choice(3, ["add"])


def test_only_known_call_arguments_pass():
    check_call_kwargs({k: None for k in CALL_KWARGS})
    with pytest.raises(InvalidRequestError, match=r"\['logit_bias'\]"):
        check_call_kwargs({"max_tokens": 3, "logit_bias": {1: 2.0}})
    check_call_kwargs({"max_tokens": 3, "frequency_penalty": 1.0})  # a sampling control now
    check_call_kwargs({"budget_closed_output": "complete"})
    with pytest.raises(InvalidRequestError, match="budget_closed_output"):
        check_call_kwargs({"budget_closed_output": "cutt"})  # checked with or without a grammar


def test_max_tokens_is_capped_by_the_room_the_prompt_leaves():
    assert max_tokens_for(None, 90, 100) == 10
    assert max_tokens_for(4, 90, 100) == 4
    assert max_tokens_for(50, 90, 100) == 10
    with pytest.raises(PromptTooLongError, match="100 tokens"):
        max_tokens_for(4, 100, 100)
    for bad in (0, -1, 2.5, "8"):
        with pytest.raises(InvalidRequestError, match="max_tokens must be an integer >= 1"):
            max_tokens_for(bad, 1, 100)


def test_max_tokens_past_the_room_is_refused_when_asked():
    assert max_tokens_for(10, 90, 100, "error") == 10
    assert max_tokens_for(None, 90, 100, "error") == 10
    with pytest.raises(PromptTooLongError, match="max_tokens=11 does not fit.* leaves 10"):
        max_tokens_for(11, 90, 100, "error")
    check_call_kwargs({"max_tokens_overflow": "error"})
    with pytest.raises(InvalidRequestError, match="max_tokens_overflow"):
        check_call_kwargs({"max_tokens_overflow": "refuse"})


def test_template_kwargs_merge_and_thinking_off_under_a_strict_grammar():
    base = {"enable_thinking": True, "a": 1}
    assert template_kwargs_for(base, {"a": 2}, None) == {"enable_thinking": True, "a": 2}
    assert template_kwargs_for({}, None, json_object_grammar()) == {"enable_thinking": False}
    assert template_kwargs_for(base, None, json_object_grammar())["enable_thinking"] is True
    free = no_tool_call_grammar("hermes")
    assert "enable_thinking" not in template_kwargs_for({}, None, free)
    # reasoning= is the enable_thinking switch; the call's own template variables win
    assert template_kwargs_for(base, None, None, reasoning=False)["enable_thinking"] is False
    assert template_kwargs_for({}, {"enable_thinking": False}, None, True) == {
        "enable_thinking": False}
    assert template_kwargs_for({}, None, None, "high") == {"enable_thinking": True,
                                                           "reasoning_effort": "high"}


def test_sampling_values_call_then_instance_then_model_defaults():
    settings = ChatSettings(model="m", temperature=0.7, stop=["END"], ignore_eos=True, seed=3,
                            presence_penalty=0.5)
    sampled = {**GREEDY, "temperature": 1.0, "top_p": 0.9, "top_k": 40,
               "repetition_penalty": 1.1}
    values = sampling_values(settings, {"top_k": 5, "min_p": 0.05}, None, None, sampled)
    assert values == {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3,
                      "stop": ["END"], "ignore_eos": True, "speculation": "auto",
                      "num_speculative_tokens": 8, "min_p": 0.05, "presence_penalty": 0.5,
                      "frequency_penalty": 0.0, "repetition_penalty": 1.1}
    call = sampling_values(settings, {"temperature": 0, "seed": 9, "num_speculative_tokens": 2,
                                      "speculative_decoding": "off"}, ["x"], None, GREEDY)
    assert call["temperature"] == 0.0 and call["seed"] == 9 and call["stop"] == ["x"]
    assert call["speculation"] == "off" and call["num_speculative_tokens"] == 2
    strict = sampling_values(settings, {}, ["x"], json_object_grammar(), GREEDY)
    assert strict["stop"] == [] and strict["ignore_eos"] is False  # the grammar ends the reply
    free = sampling_values(settings, {}, None, no_tool_call_grammar("hermes"), GREEDY)
    assert free["stop"] == ["END"] and free["ignore_eos"] is False


def test_generation_defaults_are_greedy_without_a_sampling_config(tmp_path):
    assert generation_defaults(tmp_path) == GREEDY
    (tmp_path / "sampled").mkdir()
    (tmp_path / "sampled" / "generation_config.json").write_text(
        '{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20}')
    assert generation_defaults(tmp_path / "sampled") == {**GREEDY, "temperature": 0.6,
                                                          "top_p": 0.95, "top_k": 20}
    # transformers applies repetition_penalty to greedy decoding too: it is read either way
    (tmp_path / "penalized").mkdir()
    (tmp_path / "penalized" / "generation_config.json").write_text(
        '{"do_sample": false, "temperature": 0.6, "repetition_penalty": 1.15, "min_p": 0.1}')
    assert generation_defaults(tmp_path / "penalized") == {**GREEDY, "repetition_penalty": 1.15}


def test_prepare_request_validates_before_loading_the_engine():
    loaded = []
    settings = ChatSettings(model="m")
    with pytest.raises(InvalidRequestError, match="unsupported call argument"):
        prepare_request([HumanMessage("x")], None, {"bogus": 1}, settings, loaded.append)
    with pytest.raises(InvalidRequestError, match="messages is empty"):
        prepare_request([], None, {}, settings, loaded.append)
    assert loaded == []


def test_a_prepared_request_carries_prompt_params_and_reply_settings(tiny_qwen2_path):
    from langchain_ascend.chat_models import AscendChatModel

    engine = AscendChatModel(model=str(tiny_qwen2_path), device="cpu")._engine_for()
    settings = ChatSettings(model=str(tiny_qwen2_path), max_tokens=7, stop=["zz"])
    prepared = prepare_request([HumanMessage("Hello")], None, {"seed": 1}, settings,
                               lambda name: engine)
    text = engine.tokenizer.decode(prepared.prompt_token_ids)
    assert text.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    assert prepared.params.max_tokens == 7 and prepared.params.stop == ["zz"]
    assert prepared.params.seed == 1 and prepared.params.constraint is None
    assert prepared.assembler_kwargs["parse_tools"] is False
    assert prepared.count_tokens("Hello") == len(engine.tokenizer.encode("Hello"))
