"""The engine and the chat model on a real accelerator (skipped without one, saying why).

Greedy tokens on the device must equal ``model.generate`` on the same device in fp32, for one
request, concurrent requests and a multi-hop conversation served from the prefix cache; the
chat model's forced tool calls must parse on the device as they do on the CPU.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM  # noqa: E402

from langchain_ascend.engine.core.sampling_params import SamplingParams  # noqa: E402
from langchain_ascend.engine.llm_engine import LLMEngine  # noqa: E402
from langchain_ascend.testing import accelerator_params  # noqa: E402

DEVICES = accelerator_params()

PROMPTS = [
    "Tools: search(query), calculator(expression). Question: what is 17 * 23?",
    "The quick brown fox jumps over the lazy dog.",
    "A much longer prompt that spans many blocks of the paged cache, " * 3,
    "Numbers 1 2 3 4 5 6 7 8 9 10 11 12",
]


def reference_tokens(model, prompt: list[int], new_tokens: int, device: str,
                     eos: set[int]) -> list[int]:
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=new_tokens, do_sample=False)
    tokens = out[0, len(prompt):].tolist()
    for i, tok in enumerate(tokens):  # the engine returns the tokens before EOS
        if tok in eos:
            return tokens[:i]
    return tokens


@pytest.fixture(scope="module")
def device_setups(tiny_qwen2_path):
    built: dict[str, tuple[LLMEngine, object]] = {}
    yield lambda device: built.get(device) or built.setdefault(device, (
        LLMEngine(tiny_qwen2_path, device=device, dtype="float32", num_blocks=64),
        AutoModelForCausalLM.from_pretrained(tiny_qwen2_path, dtype=torch.float32)
        .to(device).eval()))
    for engine, _ in built.values():
        engine.shutdown()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_on_device_matches_generate(device_setups, device):
    engine, model = device_setups(device)
    assert engine.device.type == device
    eos = set(engine.eos_token_ids)
    prompt = engine.tokenizer.encode(PROMPTS[0])
    out = engine.generate(prompt, SamplingParams(max_tokens=12))
    assert out.token_ids == reference_tokens(model, prompt, 12, device, eos)


@pytest.mark.parametrize("device", DEVICES)
def test_concurrent_requests_on_device_match_generate(device_setups, device):
    engine, model = device_setups(device)
    eos = set(engine.eos_token_ids)
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    lengths = [5, 9, 7, 11]
    results: dict[int, list[int]] = {}

    def call(i: int) -> None:
        results[i] = engine.generate(prompts[i], SamplingParams(max_tokens=lengths[i])).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, prompt in enumerate(prompts):
        assert results[i] == reference_tokens(model, prompt, lengths[i], device, eos), i


@pytest.mark.parametrize("device", DEVICES)
def test_multi_hop_on_device_reads_the_prefix_cache(device_setups, device):
    engine, model = device_setups(device)
    eos = set(engine.eos_token_ids)
    history = engine.tokenizer.encode(PROMPTS[2])
    for hop in range(3):
        out = engine.generate(history, SamplingParams(max_tokens=6))
        assert out.token_ids == reference_tokens(model, history, 6, device, eos), hop
        if hop:
            assert out.stats.num_cached_tokens > 0, hop
        history = history + out.token_ids + engine.tokenizer.encode(f" result {hop}.")


@pytest.mark.parametrize("device", DEVICES)
def test_moved_prefix_blocks_on_device_stay_exact(device_setups, device):
    """A second session over the same system prompt moves the first session's cached blocks
    (a K/V copy on the device); the first session's next hop reads the moved copies."""
    engine, model = device_setups(device)
    eos = set(engine.eos_token_ids)
    system = engine.tokenizer.encode(PROMPTS[2])
    first = system + engine.tokenizer.encode(" Question A: the weather in Paris?")
    out_a = engine.generate(first, SamplingParams(max_tokens=6))
    moved = engine.driver.kv.pool.num_relocations
    second = system + engine.tokenizer.encode(" Question B: two flights to Berlin.")
    out_b = engine.generate(second, SamplingParams(max_tokens=6))
    assert out_b.token_ids == reference_tokens(model, second, 6, device, eos)
    assert engine.driver.kv.pool.num_relocations > moved
    history = first + out_a.token_ids + engine.tokenizer.encode(" Observation: sunny.")
    out_a2 = engine.generate(history, SamplingParams(max_tokens=6))
    assert out_a2.stats.num_cached_tokens >= len(first) - engine.block_size
    assert out_a2.token_ids == reference_tokens(model, history, 6, device, eos)


@pytest.mark.parametrize("device", DEVICES)
def test_chat_model_forced_tool_call_on_device(tiny_qwen2_path, device):
    from langchain_ascend.chat_models import AscendChatModel

    def get_weather(city: str) -> str:
        """Weather of a city."""
        return f"sunny in {city}"

    chat = AscendChatModel(model=str(tiny_qwen2_path), device=device, temperature=0,
                           max_tokens=48)
    bound = chat.bind_tools([get_weather], tool_choice="get_weather")
    reply = bound.invoke("What is the weather in Paris?")
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"]
    assert isinstance(reply.tool_calls[0]["args"].get("city"), str)
    chunks = list(bound.stream("What is the weather in Paris?"))
    assert len(chunks) > 1
    assert reply.usage_metadata and reply.usage_metadata["output_tokens"] > 0
