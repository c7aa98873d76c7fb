"""Greedy text of SmolLM2 run from its GGUF blocks does not depend on how its steps ran
(issue 23): solo, streamed, batched with other requests, with speculation on or off, and
decoding while another request's prompt is prefilled in the same steps.

Pure-decode steps run every layer in one native call (``engine.cpu.decoder``); prefills and
mixed prefill+decode steps run the per-op path. The quantized products give each row the same
bits whatever the batch (``native.qmatmul``), and the per-op path runs the stack's own code
(the SiLU, the RMSNorm kernel for any number of rows). Decode attention is the paged kernel for
every decode step, decodes sharing the chat template's system-prompt blocks included (it reads
those blocks once for all rows and computes each row as alone), and a speculative verify
pass's rows run as the one-row decodes they stand for (``engine.worker.packing``), so a
request's tokens are the same either way.
Each request decodes 48 tokens (``ignore_eos``); several minutes on two cores, hence ``slow``.
"""

from __future__ import annotations

import threading

import pytest
from langchain_core.messages import HumanMessage

from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.testing import needs_smollm2
from langchain_ascend.testing.real_model import smollm2_chat_kwargs

pytestmark = [needs_smollm2(), pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Name three colours of the rainbow."]
LONG_PROMPT = "Summarise this text. " + " ".join(
    f"Paragraph {i}: the committee met on day {i} and agreed on item {i * 7}." for i in range(40))


@pytest.fixture(scope="module")
def chat() -> AscendChatModel:
    return AscendChatModel(**smollm2_chat_kwargs(max_tokens=48, ignore_eos=True))


@pytest.fixture(scope="module")
def solo(chat) -> list[str]:
    """Each prompt alone, speculation off: the reference text."""
    return [chat.invoke([HumanMessage(p)], speculative_decoding="off").content for p in PROMPTS]


def test_solo_texts_are_real_replies(solo, chat):
    assert all(text.strip() for text in solo)
    usage = chat.invoke([HumanMessage(PROMPTS[0])], speculative_decoding="off").usage_metadata
    assert usage["output_tokens"] == 48


def test_streaming_gives_the_solo_text(chat, solo):
    for prompt, want in zip(PROMPTS, solo, strict=True):
        got = "".join(chunk.content for chunk in chat.stream(
            [HumanMessage(prompt)], speculative_decoding="off"))
        assert got == want


def test_a_batch_gives_the_solo_texts(chat, solo):
    got = chat.batch([[HumanMessage(p)] for p in PROMPTS], speculative_decoding="off")
    assert [m.content for m in got] == solo


@pytest.mark.parametrize("mode", ["auto", "prompt_lookup"])
def test_speculation_gives_the_solo_texts(chat, solo, mode):
    """"auto" drafts where the row cost measured at start lets it (on a loaded machine it may
    not); "prompt_lookup" always drafts, through the same verify passes."""
    replies = [chat.invoke([HumanMessage(p)], speculative_decoding=mode) for p in PROMPTS]
    assert [reply.content for reply in replies] == solo
    if mode == "prompt_lookup":
        speculative = [reply.response_metadata["speculative"] for reply in replies]
        assert sum(s["accepted_tokens"] for s in speculative) > 0  # drafts verified and kept
        assert sum(s["draft_tokens"] - s["accepted_tokens"] for s in speculative) > 0


def test_batched_speculation_gives_the_solo_texts(chat, solo):
    batched = chat.batch([[HumanMessage(p)] for p in PROMPTS], speculative_decoding="auto")
    assert [m.content for m in batched] == solo


def test_decoding_beside_a_prefill_gives_the_solo_text(chat, solo):
    """A long prompt submitted while the first request decodes: steps that mix its prefill
    with the decode run per op, the others in the stack."""
    chunks: list[str] = []
    started = threading.Event()
    other: list[str] = []

    def late() -> None:
        started.wait(timeout=600)
        other.append(chat.invoke([HumanMessage(LONG_PROMPT)],
                                 speculative_decoding="off").content)

    thread = threading.Thread(target=late)
    thread.start()
    for chunk in chat.stream([HumanMessage(PROMPTS[1])], speculative_decoding="off"):
        chunks.append(chunk.content)
        if len(chunks) == 4:
            started.set()
    started.set()
    thread.join(timeout=900)
    assert "".join(chunks) == solo[1]
    assert other and other[0]
