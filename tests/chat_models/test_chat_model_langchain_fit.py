"""What a LangChain user arrives with: token counting with the model's own template (equal to
``input_tokens``, offline, ``trim_messages``), ``profile``, readable model names, the argument
spellings of other chat models, sampling penalties, ``stream_usage`` and ``reasoning``."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)
from pydantic import ValidationError

from langchain_ascend.chat.model_names import readable_model_name
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.errors import InvalidRequestError

CONVERSATION = [
    SystemMessage("You answer briefly."),
    HumanMessage("What is the weather in Paris?"),
    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"},
                               "id": "call_1", "type": "tool_call"}]),
    ToolMessage("sunny, 21 C", tool_call_id="call_1"),
    AIMessage("It is sunny in Paris."),
    HumanMessage("And tomorrow?"),
]


@pytest.fixture
def offline(monkeypatch):
    """No hub: counting must never reach for LangChain's GPT-2 tokenizer."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def test_count_equals_input_tokens_with_and_without_tools(tiny_chat, weather_tools, offline):
    plain = tiny_chat.get_num_tokens_from_messages(CONVERSATION)
    assert plain == tiny_chat.invoke(CONVERSATION, max_tokens=2).usage_metadata["input_tokens"]
    as_tuples = [("system", "You answer briefly."), ("user", "What is the weather in Paris?")]
    assert tiny_chat.get_num_tokens_from_messages(as_tuples) == (  # as invoke takes them
        tiny_chat.get_num_tokens_from_messages(CONVERSATION[:2]))
    with_tools = tiny_chat.get_num_tokens_from_messages(CONVERSATION, tools=weather_tools)
    assert with_tools > plain  # the template renders the tool schemas
    reply = tiny_chat.bind_tools(weather_tools).invoke(CONVERSATION, max_tokens=2)
    assert with_tools == reply.usage_metadata["input_tokens"]


def test_count_equals_input_tokens_in_the_fallback_tool_format(tiny_no_tools_chat,
                                                               weather_tools, offline):
    """SmolLM2-like template without tools: the schemas go into the system turn."""
    count = tiny_no_tools_chat.get_num_tokens_from_messages(CONVERSATION, tools=weather_tools)
    assert count > tiny_no_tools_chat.get_num_tokens_from_messages(CONVERSATION)
    reply = tiny_no_tools_chat.bind_tools(weather_tools).invoke(CONVERSATION, max_tokens=2)
    assert count == reply.usage_metadata["input_tokens"]


def test_count_before_any_call_loads_no_weights(tiny_qwen2_path, offline):
    fresh = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", max_tokens=2,
                            max_context_length=512)
    count = fresh.get_num_tokens_from_messages(CONVERSATION[:2])
    assert fresh._engines.engines == {}  # the tokenizer alone
    assert count == fresh.invoke(CONVERSATION[:2]).usage_metadata["input_tokens"]


def test_token_ids_are_the_models_own(tiny_chat, offline):
    tokenizer = tiny_chat._engine_for().tokenizer
    text = "Paris is sunny today"
    assert tiny_chat.get_token_ids(text) == tokenizer.encode(text, add_special_tokens=False)
    assert tiny_chat.get_num_tokens(text) == len(tiny_chat.get_token_ids(text))


def test_trim_messages_with_the_chat_model_as_counter(tiny_chat, offline):
    full = tiny_chat.get_num_tokens_from_messages(CONVERSATION)
    limit = full - 10
    trimmed = trim_messages(CONVERSATION, max_tokens=limit, token_counter=tiny_chat,
                            strategy="last", include_system=True, start_on="human")
    assert trimmed and trimmed[0] == CONVERSATION[0] and trimmed[-1] == CONVERSATION[-1]
    assert len(trimmed) < len(CONVERSATION)
    assert tiny_chat.get_num_tokens_from_messages(trimmed) <= limit
    # slices a call would refuse are still counted: a tool result whose call was cut, nothing
    assert tiny_chat.get_num_tokens_from_messages(CONVERSATION[3:]) > 0
    assert tiny_chat.get_num_tokens_from_messages([]) == 0


def test_profile_reports_the_context_the_engine_uses(tiny_chat, tiny_qwen2_path):
    engine = tiny_chat._engine_for()
    profile = tiny_chat.profile
    assert profile["max_input_tokens"] == engine.max_context_length
    config = json.loads((Path(tiny_qwen2_path) / "config.json").read_text())
    assert profile["max_input_tokens"] == config["max_position_embeddings"]
    assert profile["tool_calling"] and profile["structured_output"]
    assert profile["reasoning_output"] is False  # the template writes no <think>
    short = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", n_ctx=512)
    assert short.max_context_length == 512 and short.profile["max_input_tokens"] == 512
    # asking for more than the model's context: the profile says what the engine allows
    long = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", n_ctx=100_000)
    assert long.profile["max_input_tokens"] == config["max_position_embeddings"]


def test_profile_sees_a_thinking_template(tiny_qwen2_path):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
                "enable_thinking %}<think>\n\n</think>\n\n{% endif %}")
    chat = AscendChatModel(model=str(tiny_qwen2_path), device="cpu", chat_template=template)
    assert chat.profile["reasoning_output"] is True


def test_model_name_is_never_a_path(tiny_chat, tmp_path):
    reply = tiny_chat.invoke("Hi", max_tokens=2)
    name = reply.response_metadata["model_name"]
    assert "/" not in name and name == Path(tiny_chat.model).name
    assert reply.response_metadata["model_provider"] == "ascend"
    assert tiny_chat._get_ls_params()["ls_model_name"] == name
    # a hub id stays as given; a cache snapshot folder is its hub id; a config naming a hub id
    assert readable_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    assert readable_model_name(str(snapshot)) == "Qwen/Qwen2.5-0.5B-Instruct"
    folder = tmp_path / "local-copy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "org/finetune-7b"}))
    assert readable_model_name(str(folder)) == "org/finetune-7b"
    (folder / "config.json").write_text(json.dumps({"_name_or_path": str(folder)}))
    readable_model_name.cache_clear()
    assert readable_model_name(str(folder)) == "local-copy"


def test_gguf_model_name_is_its_general_name():
    from langchain_ascend.testing.real_model import _find_smollm2

    path, problem = _find_smollm2()
    if path is None:
        pytest.skip(problem)
    name = readable_model_name(str(path))
    assert name.lower().startswith("smollm2") and "/" not in name


def test_argument_spellings_of_other_chat_models(tiny_qwen2_path):
    path = str(tiny_qwen2_path)
    chat = AscendChatModel(model_path=path, n_ctx=1024, repetition_penalty=1.1, device="cpu")
    assert (chat.model, chat.max_context_length, chat.repetition_penalty) == (path, 1024, 1.1)
    chat = AscendChatModel(model_id=path, max_model_len=256, repeat_penalty=1.2,
                           max_completion_tokens=7, device="cpu")
    assert (chat.model, chat.max_context_length, chat.repetition_penalty,
            chat.max_tokens) == (path, 256, 1.2, 7)
    with pytest.raises(ValidationError, match="two spellings of 'max_context_length'"):
        AscendChatModel(model=path, n_ctx=512, max_model_len=1024)
    with pytest.raises(ValidationError, match="repetition_penalty"):
        AscendChatModel(model=path, repetition_penalty=0)
    with pytest.raises(ValidationError, match="presence_penalty"):
        AscendChatModel(model=path, presence_penalty=2.5)


def test_a_pathlib_path_names_the_model(tiny_qwen2_path):
    chat = AscendChatModel(model=Path(tiny_qwen2_path), device="cpu")
    assert chat.model == str(tiny_qwen2_path)
    assert AscendChatModel(model_path=Path(tiny_qwen2_path)).model == str(tiny_qwen2_path)


def test_arguments_of_remote_models_warn_by_name(tiny_qwen2_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AscendChatModel(model=str(tiny_qwen2_path), timeout=30, max_retries=3, keep_alive=5)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    for name in ("timeout=", "max_retries=", "keep_alive="):
        assert any(name in text and "no effect" in text for text in said), (name, said)


def test_model_kwargs(tiny_qwen2_path):
    path = str(tiny_qwen2_path)
    chat = AscendChatModel(model=path, model_kwargs={"top_k": 3, "repeat_penalty": 1.05})
    assert chat.top_k == 3 and chat.repetition_penalty == 1.05 and chat.model_kwargs == {}
    with pytest.raises(ValidationError, match="revision.*local path"):
        AscendChatModel(model=path, model_kwargs={"revision": "main"})
    with pytest.raises(ValidationError, match="model_kwargs key 'trust_remote_code'"):
        AscendChatModel(model=path, model_kwargs={"trust_remote_code": True})
    with pytest.raises(ValidationError, match="both as an argument and in model_kwargs"):
        AscendChatModel(model=path, top_k=2, model_kwargs={"top_k": 3})


def test_per_call_penalties_are_checked_and_reach_the_engine(tiny_chat):
    with pytest.raises(InvalidRequestError, match="frequency_penalty"):
        tiny_chat.invoke("Hi", frequency_penalty=3)
    with pytest.raises(InvalidRequestError, match="reasoning"):
        tiny_chat.invoke("Hi", reasoning="max")
    call = {"repetition_penalty": 2.0, "frequency_penalty": 1.5, "presence_penalty": -0.5,
            "min_p": 0.1}
    params = tiny_chat._prepare([HumanMessage("Hi")], None, call).params
    assert {name: getattr(params, name) for name in call} == call
    default = tiny_chat._prepare([HumanMessage("Hi")], None, {}).params
    assert not default.has_penalties  # the tiny model's generation config sets none
    reply = tiny_chat.invoke("Numbers 1 2 3 1 2 3 1 2 3", max_tokens=8, **call)
    assert reply.response_metadata["speculative"]["draft_tokens"] == 0  # no drafting


def test_stream_usage_off_leaves_usage_out_of_chunks(tiny_chat):
    chunks = list(tiny_chat.stream("Hi", max_tokens=3, stream_usage=False))
    assert chunks and all(c.usage_metadata is None for c in chunks)
    chunks = list(tiny_chat.stream("Hi", max_tokens=3))
    assert chunks[-1].usage_metadata is not None


def test_generation_config_repetition_penalty_gives_hf_greedy_text(tiny_qwen2_path, tmp_path):
    """A model whose generation_config.json sets repetition_penalty: the chat model's greedy
    reply is transformers ``generate``'s, which applies it by default."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "penalized"
    shutil.copytree(tiny_qwen2_path, folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "repetition_penalty": 1.3}))
    chat = AscendChatModel(model=str(folder), device="cpu", max_tokens=24,
                           speculative_decoding="prompt_lookup")
    messages = [HumanMessage("Numbers 1 2 3 4 5 6 7 8 9 10 and again 1 2 3 4 5")]
    reply = chat.invoke(messages)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": messages[0].content}],
                                           add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert model.generation_config.repetition_penalty == 1.3
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24)
    want = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert reply.content == want.strip() or reply.content == want
    unpenalized = AscendChatModel(model=str(folder), device="cpu", max_tokens=24,
                                  repetition_penalty=1.0).invoke(messages)
    assert unpenalized.content != reply.content  # the config's penalty is what changed it
    chat.get_engine().shutdown()
