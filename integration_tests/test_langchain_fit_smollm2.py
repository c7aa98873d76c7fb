"""Issue 28 on the real SmolLM2-135M-Instruct GGUF (CPU, greedy, offline): token counting with
its own ChatML template equals ``input_tokens`` (tools through the fallback format included),
``trim_messages(token_counter=llm)`` works without the hub, ``profile["max_input_tokens"]`` is
the engine's context, ``model_name`` is the GGUF's ``general.name``, and the spellings ported
code passes (``model_path``, ``n_ctx``, ``repetition_penalty``) work."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages
from langchain_core.tools import tool

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs, smollm2_gguf_path

pytestmark = needs_smollm2()

HISTORY = [
    SystemMessage("You are a helpful assistant."),
    HumanMessage("What is the capital of France?"),
    AIMessage("The capital of France is Paris."),
    HumanMessage("And what is the weather there?"),
]


@tool
def get_weather(city: str) -> str:
    """Today's weather for a city."""
    return "sunny"


@pytest.fixture(scope="module")
def llm(monkeypatch_module):
    return AscendChatModel(**smollm2_chat_kwargs(max_tokens=8))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        yield patch


def test_counts_equal_input_tokens_with_and_without_tools(llm):
    count = llm.get_num_tokens_from_messages(HISTORY)
    assert count == llm.invoke(HISTORY).usage_metadata["input_tokens"]
    with_tools = llm.get_num_tokens_from_messages(HISTORY, tools=[get_weather])
    assert with_tools > count
    reply = llm.bind_tools([get_weather]).invoke(HISTORY)
    assert with_tools == reply.usage_metadata["input_tokens"]


def test_trim_messages_offline(llm):
    turns = HISTORY[1:]
    limit = llm.get_num_tokens_from_messages(turns) - 5
    trimmed = trim_messages(turns, max_tokens=limit, token_counter=llm, strategy="last",
                            start_on="human")
    assert trimmed and trimmed[-1] == turns[-1] and isinstance(trimmed[0], HumanMessage)
    assert len(trimmed) < len(turns) and llm.get_num_tokens_from_messages(trimmed) <= limit
    # include_system: trim_messages adds the system message's own count to the rest's, and
    # SmolLM2's template gives a slice without a system turn a default one, so the result is
    # within the limit with room to spare (conservative, never over)
    with_system = trim_messages(HISTORY, max_tokens=llm.get_num_tokens_from_messages(HISTORY),
                                token_counter=llm, strategy="last", include_system=True,
                                start_on="human")
    assert with_system[0] == HISTORY[0] and with_system[-1] == HISTORY[-1]


def test_profile_name_and_ported_arguments(llm):
    assert llm.profile["max_input_tokens"] == llm.get_engine().max_context_length == 2048
    name = llm.invoke("Hi").response_metadata["model_name"]
    assert name.lower().startswith("smollm2") and "/" not in name
    ported = AscendChatModel(model_path=str(smollm2_gguf_path()), n_ctx=2048,
                             repetition_penalty=1.1, device="cpu", max_batch_size=8,
                             temperature=0, max_tokens=8)
    assert ported.profile["max_input_tokens"] == 2048
    assert ported.get_engine() is llm.get_engine()  # same engine settings: one shared engine
    reply = ported.invoke("Count from one to ten: one, two, three,")
    assert reply.usage_metadata["output_tokens"] > 0
    default = AscendChatModel(model=str(smollm2_gguf_path()))
    assert default.profile["max_input_tokens"] == 8192  # the GGUF's llama.context_length
