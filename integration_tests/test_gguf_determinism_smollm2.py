"""Greedy text of SmolLM2 run from its GGUF blocks does not depend on how its steps ran
(issue 23): solo, streamed, batched with other requests, with speculation on or off, and
decoding while another request's prompt is prefilled in the same steps.

Pure-decode steps run every layer in one native call (``native/decode_stack.c``); prefills,
mixed prefill+decode steps and speculative verify passes run the per-op path. The quantized
products give each row the same bits whatever the batch (``native.qmatmul``), and the per-op
path runs the stack's own elementwise code (the SiLU, ``native.decode_stack.silu_mul``; the
RMSNorm kernel for any number of rows), so a request's tokens are the same either way.
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


# Not met yet (issue 23): the three prompts share the chat template's system-prompt blocks, so
# their batched decodes attend through the shared-prefix kernel (native/decode_attention.c,
# which reads the shared blocks once for every row), while a solo decode uses the paged
# kernel; the two sum in another order and SmolLM2's int8 activations turn the last-bit
# difference into another token. Keeping the shared kernel is a speed choice (16 sessions on
# one 2k system prompt read it once per step instead of 16 times).
SHARED_PREFIX_KERNEL = pytest.mark.xfail(
    strict=True, reason="batched decodes sharing a prefix use the shared-prefix attention "
    "kernel, whose summation order differs from the paged kernel's")


@SHARED_PREFIX_KERNEL
def test_a_batch_gives_the_solo_texts(chat, solo):
    got = chat.batch([[HumanMessage(p)] for p in PROMPTS], speculative_decoding="off")
    assert [m.content for m in got] == solo


def test_speculation_gives_the_solo_texts(chat, solo):
    got = [chat.invoke([HumanMessage(p)], speculative_decoding="auto").content for p in PROMPTS]
    assert got == solo


@SHARED_PREFIX_KERNEL
def test_batched_speculation_gives_the_solo_texts(chat, solo):
    batched = chat.batch([[HumanMessage(p)] for p in PROMPTS], speculative_decoding="auto")
    assert [m.content for m in batched] == solo


@pytest.mark.xfail(strict=False, reason="once the late request has prefilled, both decode "
                   "together over the shared system-prompt blocks: the shared-prefix kernel "
                   "(see SHARED_PREFIX_KERNEL); passes when their decodes do not overlap")
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
