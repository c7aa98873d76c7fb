"""ModelRunner against the unchanged transformers model: packed paged forward == full forward.

Every test compares our packed, paged forward (one ``input_ids (1, T)`` batch, K/V in the
paged cache, no HF cache object) with transformers' own full-sequence forward / ``generate``
on the same weights, for the qwen2, llama and qwen3 tiny models.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
from langchain_ascend.engine.core.sampling_params import SamplingParams
from langchain_ascend.engine.worker.compile import StepCompiler, resolve_compile, resolve_plan
from langchain_ascend.engine.worker.kv_cache import plan_num_blocks
from langchain_ascend.engine.worker.model_runner import ModelRunner
from langchain_ascend.engine.worker.static_step import capture_sizes
from langchain_ascend.errors import InvalidRequestError
from langchain_ascend.testing import ARCHITECTURES

BLOCK = 4
GREEDY = SamplingParams(max_tokens=64)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request, tiny_model_paths):
    """(our runner, HF reference model) on the same tiny checkpoint."""
    path = tiny_model_paths[request.param]
    runner = ModelRunner.load(str(path), device="cpu", dtype="float32", block_size=BLOCK,
                              num_blocks=128, compile=False)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
    return runner, reference


@pytest.fixture(scope="module")
def qwen2_runner(tiny_model_paths):
    return ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", block_size=BLOCK,
                            num_blocks=64, compile=False)


class Blocks:
    """Hands out disjoint block tables (the test plays the block pool).

    In order by default (decodes attend one zero-copy span); ``shuffled`` scatters them over
    the pool (decodes gather their pages).
    """

    def __init__(self, shuffled: bool = False, pool: int = 120) -> None:
        self.free = list(range(pool))
        if shuffled:
            self.free = torch.randperm(pool, generator=torch.Generator().manual_seed(0)).tolist()

    def take(self, num_tokens: int) -> list[int]:
        count = -(-num_tokens // BLOCK)
        taken, self.free = self.free[:count], self.free[count:]
        return taken


def prompt(seed: int, length: int, vocab: int = 4000) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_logits(reference, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return reference(torch.tensor([token_ids])).logits[0]  # (L, V)


def seg(rid, token_ids, start, blocks, sample=True, sampling=GREEDY):
    return ScheduledSegment(rid, token_ids, start, blocks, sample, sampling)


def test_single_prefill_matches_full_forward(pair):
    runner, reference = pair
    tokens = prompt(1, 21)
    segment = seg("a", tokens, 0, Blocks().take(21))
    from langchain_ascend.engine.worker.packing import build_layout

    layout, ids, positions = build_layout([segment], BLOCK, [0])
    logits = runner.compute_logits(layout, ids, positions, list(range(21)))  # every position
    torch.testing.assert_close(logits, hf_logits(reference, tokens), atol=1e-4, rtol=1e-4)


def test_prefill_in_two_chunks_matches_full_forward(pair):
    runner, reference = pair
    tokens, blocks = prompt(2, 30), Blocks().take(30)
    first = runner.forward_batch([seg("a", tokens[:13], 0, blocks, sample=False)])
    assert first[0] == []
    indices, logits = runner.forward_batch([seg("a", tokens[13:], 13, blocks)])
    assert indices == [0]
    torch.testing.assert_close(logits[0], hf_logits(reference, tokens)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shuffled", [False, True])
def test_mixed_batch_of_prefills_and_decodes_matches_full_forward(pair, shuffled):
    runner, reference = pair
    pool = Blocks(shuffled)
    seqs = {rid: prompt(10 + i, n) for i, (rid, n) in
            enumerate([("chunked", 14), ("fresh1", 7), ("fresh2", 5), ("dec1", 7), ("dec2", 12)])}
    tables = {rid: pool.take(len(t)) for rid, t in seqs.items()}
    # Earlier step: cache the prefixes the mixed step builds on.
    runner.forward_batch([
        seg("chunked", seqs["chunked"][:9], 0, tables["chunked"], sample=False),
        seg("dec1", seqs["dec1"][:6], 0, tables["dec1"]),
        seg("dec2", seqs["dec2"][:11], 0, tables["dec2"]),
    ])
    # Prefills listed first on purpose: the runner must pack the decodes first itself.
    mixed = [
        seg("chunked", seqs["chunked"][9:], 9, tables["chunked"]),
        seg("fresh1", seqs["fresh1"], 0, tables["fresh1"]),
        seg("dec1", seqs["dec1"][6:], 6, tables["dec1"]),
        seg("fresh2", seqs["fresh2"], 0, tables["fresh2"]),
        seg("dec2", seqs["dec2"][11:], 11, tables["dec2"]),
    ]
    indices, logits = runner.forward_batch(mixed)
    assert sorted(indices) == list(range(5))
    for row, index in enumerate(indices):
        expected = hf_logits(reference, seqs[mixed[index].request_id])[-1]
        torch.testing.assert_close(logits[row], expected, atol=1e-4, rtol=1e-4)


def test_greedy_decode_matches_hf_generate(pair):
    runner, reference = pair
    pool = Blocks()
    prompts = {"short": prompt(20, 6), "long": prompt(21, 17)}
    num_new = 10
    tables = {rid: pool.take(len(p) + num_new) for rid, p in prompts.items()}
    outputs = {rid: [] for rid in prompts}
    sampled = runner.execute(ScheduledBatch(segments=[
        seg(rid, p, 0, tables[rid]) for rid, p in prompts.items()]))
    for rid, token in zip(prompts, sampled, strict=True):
        outputs[rid].append(token)
    for _ in range(num_new - 1):  # both requests decode together every step
        batch = [seg(rid, [outputs[rid][-1]], len(p) + len(outputs[rid]) - 1, tables[rid])
                 for rid, p in prompts.items()]
        for rid, token in zip(prompts, runner.execute(ScheduledBatch(segments=batch)),
                              strict=True):
            outputs[rid].append(token)
    for rid, p in prompts.items():
        with torch.inference_mode():
            expected = reference.generate(torch.tensor([p]), max_new_tokens=num_new,
                                          min_new_tokens=num_new, do_sample=False)
        assert outputs[rid] == expected[0, len(p):].tolist(), rid


def test_non_sampling_segments_get_none_in_segment_order(qwen2_runner):
    pool = Blocks()
    a, b = prompt(30, 9), prompt(31, 5)
    ta, tb = pool.take(9), pool.take(6)
    qwen2_runner.execute(ScheduledBatch(segments=[seg("b", b, 0, tb)]))
    result = qwen2_runner.execute(ScheduledBatch(segments=[
        seg("a", a[:4], 0, ta, sample=False), seg("b", [7], 5, tb)]))
    assert result[0] is None and isinstance(result[1], int)
    assert qwen2_runner.execute(ScheduledBatch()) == []


def test_bad_segments_raise_and_runner_keeps_working(qwen2_runner):
    with pytest.raises(ValueError, match="'short'.*covers 4 slots, the segment needs 6"):
        qwen2_runner.execute(ScheduledBatch(segments=[seg("short", prompt(3, 6), 0, [0])]))
    with pytest.raises(InvalidRequestError, match="'oov'.*token ids must be in"):
        qwen2_runner.execute(ScheduledBatch(segments=[seg("oov", [1, 99999], 0, [0])]))
    with pytest.raises(ValueError, match="no tokens"):
        qwen2_runner.execute(ScheduledBatch(segments=[seg("empty", [], 0, [0])]))
    assert isinstance(qwen2_runner.execute(ScheduledBatch(segments=[seg("ok", [5, 6], 0, [0])]))[0],
                      int)


def test_warmup_touches_only_the_scratch_block(qwen2_runner):
    cache = qwen2_runner.kv_cache
    usable = qwen2_runner.num_blocks
    assert qwen2_runner.scratch_block_id == usable == cache.num_blocks - 1
    layers = range(cache.num_layers)
    before = [[cache.block(layer, b).clone() for b in range(usable)] for layer in layers]
    scratch_before = cache.block(0, usable).clone()
    qwen2_runner.warmup()
    for layer in layers:
        assert all(torch.equal(cache.block(layer, b), old)
                   for b, old in enumerate(before[layer]))
    assert not torch.equal(cache.block(0, usable), scratch_before)
    assert "__warmup__" not in qwen2_runner.sampler.req_to_generator


def test_seeded_sampling_is_reproducible_and_released(qwen2_runner):
    params = SamplingParams(temperature=1.0, seed=1234)
    tokens = prompt(40, 8)

    def first_token(rid, neighbours):
        pool = Blocks()
        segs = [seg(rid, tokens, 0, pool.take(8), sampling=params)]
        segs += [seg(f"n{i}", prompt(50 + i, 5), 0, pool.take(5),
                     sampling=SamplingParams(temperature=1.0)) for i in range(neighbours)]
        out = qwen2_runner.execute(ScheduledBatch(segments=segs))
        qwen2_runner.release([f"n{i}" for i in range(neighbours)])
        return out[0]

    alone = first_token("s1", 0)
    assert "s1" in qwen2_runner.sampler.req_to_generator
    qwen2_runner.execute(ScheduledBatch(finished_ids=["s1"]))
    assert "s1" not in qwen2_runner.sampler.req_to_generator
    assert first_token("s2", 3) == alone
    qwen2_runner.release(["s2"])


def test_kv_cache_sizing():
    cpu = torch.device("cpu")
    assert plan_num_blocks(device=cpu, bytes_per_block=100, memory_fraction=0.5,
                           num_blocks=7) == 7
    capped = plan_num_blocks(device=cpu, bytes_per_block=1000, memory_fraction=1.0,
                             cpu_cap_bytes=50_000)
    assert capped == 50
    with pytest.raises(ValueError, match="kv_cache_memory_fraction"):
        plan_num_blocks(device=cpu, bytes_per_block=1, memory_fraction=1.5)
    with pytest.raises(ValueError, match="num_blocks"):
        plan_num_blocks(device=cpu, bytes_per_block=1, memory_fraction=0.5, num_blocks=1)
    with pytest.raises(ValueError, match="not enough free memory"):
        plan_num_blocks(device=cpu, bytes_per_block=10**6, memory_fraction=0.5,
                        cpu_cap_bytes=10**6)


def test_runner_sizes_its_cache_from_the_memory_fraction(tiny_model_paths):
    runner = ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", compile=False)
    per_block = runner.backend.bytes_per_block(runner.block_size, len(runner.kv_cache.tensors))
    assert runner.block_size == 16
    assert 2 <= runner.num_blocks <= 2 * 1024**3 // per_block
    assert runner.kv_cache.num_bytes <= 2 * 1024**3 + per_block
    assert runner.max_model_len == runner.config.max_position_embeddings


def test_compile_resolution_and_eager_fallback(tiny_model_paths, caplog):
    cpu = torch.device("cpu")
    assert resolve_compile("auto", cpu) is False  # no graphs on the CPU: eager
    assert resolve_compile(False, cpu) is False
    assert resolve_plan("static", cpu) == "static" and resolve_plan(False, cpu) == "eager"
    with pytest.raises(ValueError, match="compile must be"):
        resolve_compile("sometimes", cpu)
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(3) == [1, 2, 4] and capture_sizes(17) == [1, 2, 4, 8, 16, 24]

    compiled_calls = []

    def broken_compile(fn):
        def compiled(*args):
            compiled_calls.append(len(args))
            raise RuntimeError("backend exploded")

        return compiled

    runner = ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", block_size=BLOCK,
                              num_blocks=64, compile="static", max_batch_size=4)
    eager = ModelRunner.load(str(tiny_model_paths["qwen2"]), device="cpu", block_size=BLOCK,
                             num_blocks=64, compile=False)
    pool = Blocks()
    tokens, table = prompt(60, 9), pool.take(10)
    for r in (runner, eager):
        r.execute(ScheduledBatch(segments=[seg("c", tokens, 0, table)]))
    eager_logits = eager.forward_batch([seg("c", [11], 9, table)])[1]
    runner.compiler = StepCompiler(runner.static, device=cpu, mode=True,
                                   compile_fn=broken_compile)
    assert runner.compiler.enabled and runner.compiler.plan == "compile"
    with caplog.at_level(logging.WARNING, logger="langchain_ascend.engine.worker.compile"):
        fallback_logits = runner.forward_batch([seg("c", [11], 9, table)])[1]
    assert compiled_calls == [6]  # the decode step went to the compiled static step first
    assert runner.compiler.enabled is False
    assert "backend exploded" in runner.compiler.failure
    assert "running eagerly" in caplog.text
    torch.testing.assert_close(fallback_logits, eager_logits)


class OnlyToken:
    """A constraint allowing a single token id."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.accepted: list[int] = []

    def mask_logits(self, logits: torch.Tensor) -> None:
        keep = logits[self.token_id].clone()
        logits.fill_(float("-inf"))
        logits[self.token_id] = keep

    def accept_token(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_terminated(self) -> bool:
        return False


def test_constraints_steer_sampling_through_execute(qwen2_runner):
    pool = Blocks()
    constraint = OnlyToken(1234)
    sampled = SamplingParams(temperature=0.8, seed=3, constraint=OnlyToken(77))
    out = qwen2_runner.execute(ScheduledBatch(segments=[
        seg("g", prompt(80, 6), 0, pool.take(6), sampling=SamplingParams(constraint=constraint)),
        seg("s", prompt(81, 5), 0, pool.take(5), sampling=sampled),
    ]))
    assert out == [1234, 77]
    assert constraint.accepted == [1234] and sampled.constraint.accepted == [77]
    qwen2_runner.release(["g", "s"])
