"""Penalized greedy decoding end to end on CPU in fp32: the engine's tokens equal
``model.generate(do_sample=False, repetition_penalty=...)`` (and, for OpenAI's frequency /
presence penalties, ``generate`` with a logits processor of those semantics), alone, beside
other requests, with speculation asked for, and through the CPU's greedy shortcut."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, LogitsProcessorList  # noqa: E402

from langchain_ascend.engine import LLMEngine  # noqa: E402
from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402

MAX_TOKENS = 24
PROMPT = "Numbers 1 2 3 4 5 6 7 8 9 10 11 12 and again 1 2 3 4 5"


class OpenAIPenalties:
    """``logit -= frequency * count + presence * (count > 0)`` over the generated tokens."""

    def __init__(self, num_prompt_tokens: int, presence: float, frequency: float) -> None:
        self.start, self.presence, self.frequency = num_prompt_tokens, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros_like(scores)  # (1, V)
        generated = input_ids[:, self.start:]  # (1, n)
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@pytest.fixture(scope="module")
def setup(tiny_qwen2_path):
    engine = LLMEngine(tiny_qwen2_path, device="cpu", dtype="float32", block_size=4,
                       num_blocks=256, max_num_batched_tokens=256)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_path, dtype=torch.float32).eval()
    yield engine, model
    engine.shutdown()


def reference(setup, prompt: list[int], **kwargs) -> list[int]:
    engine, model = setup
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=MAX_TOKENS, **kwargs)
    tokens = out[0, len(prompt):].tolist()
    for i, token in enumerate(tokens):
        if token in engine.eos_token_ids:
            return tokens[:i]
    return tokens


def test_repetition_penalty_equals_generate(setup):
    engine, _ = setup
    prompt = engine.tokenizer.encode(PROMPT)
    want = reference(setup, prompt, repetition_penalty=1.3)
    assert want != reference(setup, prompt)  # the penalty changes this reply
    for speculation in ("off", "prompt_lookup", "auto"):
        params = SamplingParams(max_tokens=MAX_TOKENS, repetition_penalty=1.3,
                                speculation=speculation)
        out = engine.generate(prompt, params)
        assert out.token_ids == want, speculation
        assert out.stats.num_draft_tokens == 0  # penalized requests never draft


def test_openai_penalties_equal_generate_with_their_processor(setup):
    engine, _ = setup
    prompt = engine.tokenizer.encode(PROMPT)
    processor = OpenAIPenalties(len(prompt), presence=0.7, frequency=0.9)
    want = reference(setup, prompt, logits_processor=LogitsProcessorList([processor]))
    params = SamplingParams(max_tokens=MAX_TOKENS, presence_penalty=0.7, frequency_penalty=0.9)
    assert engine.generate(prompt, params).token_ids == want


def test_penalized_and_plain_requests_batched_stay_exact(setup):
    engine, _ = setup
    prompts = [engine.tokenizer.encode(text) for text in
               (PROMPT, "Agents call tools; tools return observations.", PROMPT)]
    params = [SamplingParams(max_tokens=MAX_TOKENS, repetition_penalty=1.3),
              SamplingParams(max_tokens=MAX_TOKENS, speculation="prompt_lookup"),
              SamplingParams(max_tokens=MAX_TOKENS, repetition_penalty=0.8)]
    wants = [reference(setup, prompts[0], repetition_penalty=1.3), reference(setup, prompts[1]),
             reference(setup, prompts[2], repetition_penalty=0.8)]
    results: list[list[int] | None] = [None] * 3
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = engine.generate(prompts[i], params[i]).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == wants
