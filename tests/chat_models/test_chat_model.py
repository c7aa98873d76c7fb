"""AscendChatModel end to end on the tiny random-weight qwen2 model (CPU).

A random-weight model writes gibberish, so these tests check what must hold whatever the
weights: shapes of messages and metadata, agreement of invoke/stream/batch, prefix-cache
accounting, batching, seeding, stop strings, and — through constrained decoding — valid
tool calls and structured output.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage

from langchain_ascend.chat.warm_up import warm_up_grammar_specs
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.structured.selection import grammar_backend


class _TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.chunks: list[Any] = []

    def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
        self.tokens.append(token)
        self.chunks.append(chunk)


def _aggregate(chunks):
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


def test_invoke_returns_a_message_with_usage_and_metadata(tiny_chat):
    engine = tiny_chat._engine_for()
    message = tiny_chat.invoke([SystemMessage("You are terse."), HumanMessage("Hello there")])
    assert isinstance(message, AIMessage) and message.content
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Hello there"}], add_generation_prompt=True, tokenize=False)
    usage = message.usage_metadata
    assert usage["input_tokens"] == len(engine.tokenizer.encode(prompt, add_special_tokens=False))
    assert 1 <= usage["output_tokens"] <= 16
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 <= usage["input_token_details"]["cache_read"] < usage["input_tokens"]
    meta = message.response_metadata
    assert meta["model_name"] == Path(tiny_chat.model).name
    assert meta["finish_reason"] in ("stop", "length")
    assert set(meta["timings"]) == {"queue", "time_to_first_token", "decode"}
    assert all(v >= 0 for v in meta["timings"].values())


def test_on_llm_end_gets_usage_in_llm_output_as_chat_openai_gives_it(tiny_chat):
    class Ends(BaseCallbackHandler):
        outputs: list[Any] = []

        def on_llm_end(self, response: Any, **kwargs: Any) -> None:
            self.outputs.append(response.llm_output)

    ends = Ends()
    message = tiny_chat.invoke("Hello there", config={"callbacks": [ends]})
    (output,) = ends.outputs
    usage = message.usage_metadata
    assert output["token_usage"] == {"prompt_tokens": usage["input_tokens"],
                                     "completion_tokens": usage["output_tokens"],
                                     "total_tokens": usage["total_tokens"]}
    assert output["model_name"] == message.response_metadata["model_name"]


def test_repeated_prompt_is_served_from_the_prefix_cache(tiny_chat):
    question = "Tell me about the weather in Lisbon in " + "great detail " * 20
    tiny_chat.invoke(question)
    again = tiny_chat.invoke(question)
    usage = again.usage_metadata
    block = tiny_chat._engine_for().block_size
    # Every full block but the one holding the last prompt token is reused.
    assert usage["input_token_details"]["cache_read"] >= usage["input_tokens"] - 2 * block


def test_max_tokens_ends_with_length(tiny_chat):
    message = tiny_chat.invoke("Count", max_tokens=3)
    assert message.usage_metadata["output_tokens"] == 3
    assert message.response_metadata["finish_reason"] == "length"


def test_stream_matches_invoke_and_fires_token_callbacks(tiny_chat):
    expected = tiny_chat.invoke("Describe a cat")
    recorder = _TokenRecorder()
    chunks = list(tiny_chat.stream("Describe a cat", config={"callbacks": [recorder]}))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert len(chunks) > 2  # tokens arrive one by one
    full = _aggregate(chunks)
    assert full.content == expected.content
    assert chunks[-1].chunk_position == "last"
    assert full.usage_metadata["output_tokens"] == expected.usage_metadata["output_tokens"]
    assert full.response_metadata["finish_reason"] == expected.response_metadata["finish_reason"]
    assert sum(1 for c in chunks if c.usage_metadata) == 1  # usage counted once
    assert "".join(recorder.tokens) == expected.content


def test_streaming_flag_makes_invoke_stream(tiny_qwen2_path, tiny_chat):
    streaming = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=0,
                                max_tokens=8, streaming=True)
    recorder = _TokenRecorder()
    message = streaming.invoke("Hi", config={"callbacks": [recorder]})
    assert recorder.tokens and "".join(recorder.tokens) == message.content


async def test_async_paths_match_sync(tiny_chat):
    expected = tiny_chat.invoke("Name a color")
    message = await tiny_chat.ainvoke("Name a color")
    assert message.content == expected.content
    chunks = [c async for c in tiny_chat.astream("Name a color")]
    assert _aggregate(chunks).content == expected.content
    assert chunks[-1].chunk_position == "last"


async def test_async_calls_do_not_block_the_event_loop(tiny_chat):
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    start = time.perf_counter()
    await tiny_chat.ainvoke("Tell me a story", max_tokens=30)
    elapsed = time.perf_counter() - start
    done.set()
    await task
    # A blocked loop would tick once or twice; a free one ticks about every 5 ms.
    assert ticks >= max(3, int(elapsed / 0.005) // 4)


async def test_abatch_of_16_runs_as_one_continuous_batch(tiny_chat):
    engine = tiny_chat._engine_for()
    before = engine.stats().num_steps
    prompts = [f"Question number {i}: what is {i} + {i}?" for i in range(16)]
    messages = await tiny_chat.abatch(prompts, max_tokens=12)
    steps = engine.stats().num_steps - before
    assert len(messages) == 16 and all(isinstance(m, AIMessage) for m in messages)
    assert all(m.usage_metadata["output_tokens"] == 12 for m in messages)
    # One after another would take >= 16 * 12 steps; together it is about 12 plus prefill.
    assert steps < 16 * 12 / 3


def test_batch_matches_individual_calls(tiny_chat):
    prompts = ["Hello", "Good morning", "Bonjour"]
    batched = tiny_chat.batch(prompts)
    assert [m.content for m in batched] == [tiny_chat.invoke(p).content for p in prompts]


def test_chat_models_on_one_model_share_one_engine(tiny_qwen2_path, tiny_chat):
    hot = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=1.3, seed=1)
    assert hot._engine_for() is tiny_chat._engine_for()


def test_seed_makes_sampling_reproducible(tiny_chat):
    first = tiny_chat.invoke("Say something", temperature=1.0, seed=7, max_tokens=12)
    again = tiny_chat.invoke("Say something", temperature=1.0, seed=7, max_tokens=12)
    others = {tiny_chat.invoke("Say something", temperature=1.0, seed=s, max_tokens=12).content
              for s in (8, 9, 10)}
    assert first.content == again.content
    assert len(others | {first.content}) > 1


def test_stop_string_cuts_the_reply_before_it(tiny_chat):
    full = tiny_chat.invoke("Write a sentence", max_tokens=16).content
    cut_at = full[len(full) // 2 : len(full) // 2 + 3]
    assert cut_at.strip()
    stopped = tiny_chat.invoke("Write a sentence", max_tokens=16, stop=[cut_at])
    assert stopped.content == full[: full.index(cut_at)]
    assert stopped.response_metadata["finish_reason"] == "stop"
    bound = tiny_chat.bind(stop=[cut_at]).invoke("Write a sentence", max_tokens=16)
    assert bound.content == stopped.content


def test_model_override_uses_that_models_engine(tiny_chat, tiny_model_paths):
    other = str(tiny_model_paths["llama"])
    message = tiny_chat.invoke("Hi", model=other)
    assert message.response_metadata["model_name"] == Path(other).name  # its name, not a path
    assert tiny_chat._engine_for(other) is not tiny_chat._engine_for()
    assert tiny_chat._get_ls_params(model=other)["ls_model_name"] == Path(other).name


def test_standard_tracing_params(tiny_chat):
    params = tiny_chat._get_ls_params(stop=["x"], max_tokens=5)
    assert params == {"ls_provider": "ascend", "ls_model_name": Path(tiny_chat.model).name,
                      "ls_model_type": "chat", "ls_temperature": 0.0, "ls_max_tokens": 5,
                      "ls_stop": ["x"]}
    assert tiny_chat._llm_type == "ascend-chat"
    assert tiny_chat._identifying_params["model"] == tiny_chat.model


def test_warm_up_precompiles_grammars(tiny_qwen2_path, weather_tools):
    from pydantic import BaseModel

    class Answer(BaseModel):
        text: str

    model = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", max_tokens=8)
    engine = model._engine_for()
    backend = grammar_backend(engine)
    model.warm_up(tools=weather_tools, schemas=[Answer])
    specs = warm_up_grammar_specs(engine, model._settings(), weather_tools, [Answer])
    assert len(specs) == 6  # json_mode, "none", "required", one per named tool, the schema
    assert all(backend.is_cached(spec) for spec in specs)
    assert isinstance(model.with_structured_output(Answer).invoke("x"), Answer)


def test_reasoning_section_goes_to_reasoning_content(tiny_chat, monkeypatch):
    """A template that opens <think> in the prompt (like QwQ / DeepSeek-R1 distills): a reply
    that never closes it is all reasoning, streamed or not."""
    engine = tiny_chat._engine_for()
    template = engine.tokenizer.chat_template + "{{- '<think>\\n' if add_generation_prompt else '' }}"
    monkeypatch.setattr(engine.tokenizer, "chat_template", template)
    message = tiny_chat.invoke("Think first", max_tokens=12)
    assert message.content == ""
    reasoning = message.additional_kwargs["reasoning_content"]
    assert reasoning and reasoning == reasoning.strip()
    assert 0 < message.usage_metadata["output_token_details"]["reasoning"] <= 12
    chunks = list(tiny_chat.stream("Think first", max_tokens=12))
    full = _aggregate(chunks)
    assert full.additional_kwargs["reasoning_content"] == reasoning
    assert full.content == ""
    unparsed = tiny_chat.model_copy(update={"parse_reasoning": False}).invoke(
        "Think first", max_tokens=12)
    assert unparsed.content.strip() == reasoning and "reasoning_content" not in (
        unparsed.additional_kwargs)


def test_ignore_eos_reaches_the_engine_except_under_a_grammar(tiny_qwen2_path):
    model = AscendChatModel(budget_closed_output="complete", model=str(tiny_qwen2_path), device="cpu", temperature=0,
                            max_tokens=8, ignore_eos=True)
    message = HumanMessage("Say a word")
    assert model._prepare([message], None, {}).params.ignore_eos is True
    assert model._prepare([message], None, {"ignore_eos": False}).params.ignore_eos is False
    forced = model._prepare([message], None, {"response_format": {"type": "json_object"}})
    assert forced.params.ignore_eos is False  # a grammar must be able to end the reply
    reply = model.invoke([message])
    assert reply.usage_metadata["output_tokens"] == 8
    assert reply.response_metadata["finish_reason"] == "length"
