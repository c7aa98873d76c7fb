"""The paged decode-attention kernel against a naive per-request softmax, and as a custom op."""

from __future__ import annotations

import math
import random

import pytest
import torch

from langchain_ascend.native import paged_attention
from langchain_ascend.testing import needs_native_kernels

pytestmark = needs_native_kernels()


def naive(query, cache, tables, lens, scale, window=0, softcap=0.0):
    """Per request: gather its slots in position order, softmax in float32 -> (B, H, D);
    with ``softcap`` the scaled scores are soft-capped first (Gemma 2)."""
    batch, heads, dim = query.shape
    kv_heads, block_size = cache.shape[1], cache.shape[3]
    group = heads // kv_heads
    slots_k = cache[0].reshape(kv_heads, -1, dim).float()  # (KVH, slots, D)
    slots_v = cache[1].reshape(kv_heads, -1, dim).float()
    out = torch.empty(batch, heads, dim)
    for b in range(batch):
        length = int(lens[b])
        slots = [int(tables[b][p // block_size]) * block_size + p % block_size
                 for p in range(length)]
        if window and length > window:
            slots = slots[length - window:]
        k, v = slots_k[:, slots], slots_v[:, slots]  # (KVH, L, D)
        q = query[b].float().view(kv_heads, group, dim)  # (KVH, G, D)
        scores = q @ k.transpose(1, 2) * scale  # (KVH, G, L)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        weights = torch.softmax(scores, dim=-1)  # (KVH, G, L)
        out[b] = (weights @ v).reshape(heads, dim)
    return out


def make_step(lens, *, heads=9, kv_heads=3, dim=64, block_size=16, dtype=torch.float32,
              scattered=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in lens]
    num_blocks = sum(needed) + 5
    cache = torch.randn(2, kv_heads, num_blocks, block_size, dim, generator=gen).to(dtype)
    ids = list(range(num_blocks))
    if scattered:
        random.Random(seed).shuffle(ids)
    tables = torch.zeros(len(lens), max(needed), dtype=torch.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = torch.tensor(ids[start: start + n], dtype=torch.int32)
        start += n
    query = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    return query, cache, tables, torch.tensor(lens, dtype=torch.long)


CASES = [
    dict(lens=[1]),
    dict(lens=[5, 37, 100]),
    dict(lens=[300, 17, 64, 65], heads=8, kv_heads=2, dim=128),
    dict(lens=[700, 1], heads=4, kv_heads=4, dim=32, block_size=8),
    dict(lens=[1030], heads=14, kv_heads=2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scattered", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_paged_decode_matches_naive_softmax(case, scattered, dtype):
    case = dict(case)
    lens = case.pop("lens")
    query, cache, tables, seq_lens = make_step(lens, dtype=dtype, scattered=scattered, **case)
    scale = 1 / math.sqrt(query.shape[2])
    out = paged_attention.paged_decode(query, cache, tables, seq_lens, scale)
    assert out is not None and out.dtype == dtype and out.shape == query.shape
    expected = naive(query, cache, tables, seq_lens, scale)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output is rounded once
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_attends_only_the_last_keys(dtype):
    query, cache, tables, seq_lens = make_step([50, 90, 7], dim=32, block_size=8, dtype=dtype)
    out = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.2, window=20)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), naive(query, cache, tables, seq_lens, 0.2, 20),
                               atol=tol, rtol=tol)
    full = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.2)
    assert not torch.allclose(out[:2].float(), full[:2].float())  # windows changed the result
    torch.testing.assert_close(out[2], full[2])  # shorter than the window: all keys


def test_split_size_does_not_change_the_result(monkeypatch):
    query, cache, tables, seq_lens = make_step([2000])
    outs = []
    for keys in (4096, 256, 64):
        monkeypatch.setattr(paged_attention, "SPLIT_KEYS", keys)
        outs.append(paged_attention.paged_decode(query, cache, tables, seq_lens, 0.1))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(outs[0], outs[2], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(dtype, threads):
    """Batch invariance: the key ranges are fixed per row, so a request decoding beside others
    (longer, shorter, many) rounds exactly as it does alone."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lens = [700, 3000, 40, 1500, 2, 700]
        query, cache, tables, seq_lens = make_step(lens, dtype=dtype)
        batched = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125)
        for b in range(len(lens)):
            alone = paged_attention.paged_decode(query[b:b + 1], cache, tables[b:b + 1],
                                                 seq_lens[b:b + 1], 0.125)
            assert torch.equal(alone[0], batched[b]), f"row {b} (length {lens[b]})"
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("window", [0, 300])
def test_a_prefill_as_rows_gets_each_rows_bits_in_any_number_of_calls(monkeypatch, window):
    """A prefill's tokens as rows of one table (lengths c+1 .. c+n; the CPU backend's
    prefills): more rows than an item holds, split over calls when their states would exceed
    STATE_BYTES, each row bit for bit its decode alone."""
    gen = torch.Generator().manual_seed(3)
    context, new, block_size = 500, 150, 16
    blocks = -(-(context + new) // block_size)
    cache = torch.randn(2, 3, blocks + 4, block_size, 64, generator=gen)
    ids = list(range(blocks + 4))
    random.Random(3).shuffle(ids)
    table = torch.tensor(ids[:blocks], dtype=torch.int32)
    tables = table[None, :].expand(new, -1)  # (new, W): one table, stride 0 between rows
    lens = torch.arange(context + 1, context + new + 1, dtype=torch.int64)
    query = torch.randn(new, 9, 64, generator=gen)
    whole = paged_attention.paged_decode(query, cache, tables, lens, 0.125, window)
    torch.testing.assert_close(whole, naive(query, cache, tables, lens, 0.125, window),
                               atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(paged_attention, "STATE_BYTES", 40 * 9 * 3 * 66 * 4)  # ~40 rows
    assert torch.equal(paged_attention.paged_decode(query, cache, tables, lens, 0.125, window),
                       whole)
    for row in range(new):  # rows of one item end at different keys: each as alone
        alone = paged_attention.paged_decode(query[row:row + 1], cache, table[None, :],
                                             lens[row:row + 1], 0.125, window)
        assert torch.equal(alone[0], whole[row]), f"row {row}"


def shared_prefix_step(dtype, *, prefix_blocks=130, block_size=16, seed=1):
    """Nine rows over one cache: five decodes sharing a prefix of ``prefix_blocks`` blocks
    (private tails of different lengths, one row inside the prefix), then a verify pass's four
    rows (one table, lengths p+1..p+4) that share the same prefix."""
    gen = torch.Generator().manual_seed(seed)
    prefix = prefix_blocks * block_size
    lens = [prefix + 40, prefix + 3, prefix + 300, prefix - 100, prefix + 17]
    lens += [prefix + 200 + i for i in range(4)]
    tails = [-(-(n - prefix) // block_size) if n > prefix else 0 for n in lens]
    num_blocks = prefix_blocks + sum(tails[:5]) + tails[-1] + 3
    cache = torch.randn(2, 3, num_blocks, block_size, 64, generator=gen).to(dtype)
    ids = list(range(prefix_blocks, num_blocks))
    random.Random(seed).shuffle(ids)
    width = prefix_blocks + max(tails)
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    tables[:, :prefix_blocks] = torch.arange(prefix_blocks, dtype=torch.int32)
    verify_tail = [ids.pop() for _ in range(tails[-1])]
    for b, n in enumerate(tails):
        own = verify_tail[:n] if b >= 5 else [ids.pop() for _ in range(n)]
        tables[b, prefix_blocks: prefix_blocks + n] = torch.tensor(own, dtype=torch.int32)
    query = torch.randn(len(lens), 9, 64, generator=gen).to(dtype)
    return query, cache, tables, torch.tensor(lens, dtype=torch.long)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("window", [0, 1000])
def test_rows_sharing_a_prefix_get_the_bits_of_each_alone(dtype, threads, window):
    """Rows reading the same blocks (a shared prefix, a verify pass's rows) are attended
    together, keys read once for all of them, and each row still equals its decode alone."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        query, cache, tables, seq_lens = shared_prefix_step(dtype)
        batched = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125, window)
        expected = naive(query, cache, tables, seq_lens, 0.125, window)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(batched.float(), expected, atol=tol, rtol=tol)
        for b in range(len(seq_lens)):
            alone = paged_attention.paged_decode(query[b:b + 1], cache, tables[b:b + 1],
                                                 seq_lens[b:b + 1], 0.125, window)
            assert torch.equal(alone[0], batched[b]), f"row {b} (length {int(seq_lens[b])})"
        # the same rows in another order: the same bits, row for row
        order = torch.randperm(len(seq_lens), generator=torch.Generator().manual_seed(3))
        shuffled = paged_attention.paged_decode(query[order], cache, tables[order],
                                                seq_lens[order], 0.125, window)
        assert torch.equal(shuffled, batched[order])
    finally:
        torch.set_num_threads(previous)


def test_a_block_id_outside_the_cache_is_a_typed_error():
    query, cache, tables, seq_lens = make_step([40])
    tables[0, 1] = cache.shape[2]
    with pytest.raises(ValueError, match="block id"):
        paged_attention.paged_decode(query, cache, tables, seq_lens, 0.1)


def test_layouts_the_kernel_does_not_read_return_none():
    query, cache, tables, seq_lens = make_step([40])
    assert paged_attention.paged_decode(query.half(), cache.half(), tables, seq_lens, 1.) is None
    assert paged_attention.paged_decode(query, cache, tables.long(), seq_lens, 1.0) is None
    assert paged_attention.paged_decode(query[:, :, :60], cache[..., :60], tables, seq_lens,
                                        1.0) is None  # head size not a multiple of 8


def test_custom_op_runs_eagerly_and_in_a_fullgraph_compile():
    query, cache, tables, seq_lens = make_step([33, 70])
    paged_attention.paged_decode_op()
    op = torch.ops.langchain_ascend.paged_decode_attention
    eager = op(query, cache, tables, seq_lens, 0.125, 0)
    torch.testing.assert_close(eager, paged_attention.paged_decode(query, cache, tables,
                                                                   seq_lens, 0.125))

    def step(q, c, t, n):
        return op(q * 2.0, c, t, n, 0.125, 0) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(query, cache, tables, seq_lens),
                               step(query, cache, tables, seq_lens))
    with pytest.raises(ValueError, match="does not apply"):
        op(query.double(), cache.double(), tables, seq_lens, 0.125, 0)


def test_float32_queries_over_a_float16_cache_equal_the_widened_cache() -> None:
    """The float16 reader widens each key and value exactly (F16C), so its output is the
    float32 kernel's over the same values widened: bit for bit, shared prefixes included."""
    if not paged_attention.available(torch.float32, torch.float16):
        pytest.skip(f"kernel not built here: {paged_attention.unavailable_reason()}")
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 3, 20, 16, 64, generator=gen).half()  # (2, KVH, NB, BS, D)
    query = torch.randn(3, 9, 64, generator=gen)  # (B, H, D)
    tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 8, 9]], dtype=torch.int32)
    lens = torch.tensor([60, 33, 50])
    ours = paged_attention.paged_decode(query, cache, tables, lens, 0.125, 0)
    widened = paged_attention.paged_decode(query, cache.float().contiguous(), tables, lens,
                                           0.125, 0)
    assert ours is not None and ours.dtype == torch.float32
    assert torch.equal(ours, widened)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_where_the_blocks_lie_does_not_change_a_bit(cache_dtype) -> None:
    """The same keys in consecutive blocks or scattered over the cache (a prefix block the
    pool relocated): the same output, bit for bit (chunks follow positions, not blocks)."""
    if not paged_attention.available(torch.float32, cache_dtype):
        pytest.skip(f"kernel not built here: {paged_attention.unavailable_reason()}")
    gen = torch.Generator().manual_seed(11)
    blocks, block_size, kv_heads, dim, length = 12, 16, 3, 64, 150  # 10 blocks in use
    together = torch.randn(2, kv_heads, blocks, block_size, dim, generator=gen).to(cache_dtype)
    order = [7, 2, 9, 0, 11, 4, 1, 10, 3, 5]  # where logical block i lives when scattered
    scattered = torch.zeros_like(together)
    for logical, physical in enumerate(order):
        scattered[:, :, physical] = together[:, :, logical]
    query = torch.randn(2, 9, dim, generator=gen)  # (B, H, D)
    lens = torch.tensor([length, 70])
    consecutive = torch.arange(10, dtype=torch.int32).repeat(2, 1)
    moved = torch.tensor(order, dtype=torch.int32).repeat(2, 1)
    a = paged_attention.paged_decode(query, together, consecutive, lens, 0.125, 0)
    b = paged_attention.paged_decode(query, scattered, moved, lens, 0.125, 0)
    assert a is not None and torch.equal(a, b)


SOFTCAP = 1.5
"""A cap the random scores (about unit spread) feel: the capped result is far from the plain one."""


@pytest.mark.parametrize(("dtype", "cache_dtype"), [(torch.float32, torch.float32),
                                                    (torch.bfloat16, torch.bfloat16),
                                                    (torch.float32, torch.float16)])
@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("case", CASES[1:4])
def test_softcap_matches_the_naive_softcapped_softmax(case, window, dtype, cache_dtype):
    """Gemma 2's logit soft-cap: every scaled score becomes ``cap * tanh(s / cap)`` before the
    softmax, for every cache type, windows included; the plain result is far off."""
    if not paged_attention.available(dtype, cache_dtype):
        pytest.skip(f"kernel not built here: {paged_attention.unavailable_reason()}")
    case = dict(case)
    query, cache, tables, seq_lens = make_step(case.pop("lens"), dtype=dtype, **case)
    cache = cache.to(cache_dtype)
    scale = 1 / math.sqrt(query.shape[2])
    out = paged_attention.paged_decode(query, cache, tables, seq_lens, scale, window, SOFTCAP)
    assert out is not None and out.dtype == dtype
    expected = naive(query, cache, tables, seq_lens, scale, window, SOFTCAP)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    plain = naive(query, cache, tables, seq_lens, scale, window)
    assert (plain - expected).abs().max() > 20 * tol


def test_softcap_zero_is_the_uncapped_kernel_bit_for_bit():
    query, cache, tables, seq_lens = make_step([5, 37, 300])
    default = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125, 20)
    assert torch.equal(paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125, 20,
                                                    0.0), default)
    with pytest.raises(ValueError, match="softcap"):
        paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125, 0, -1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_softcapped_rows_get_the_bits_of_each_alone(dtype, threads):
    """Batch invariance holds with the cap on: rows sharing a prefix, a verify pass's rows and
    unrelated rows each equal their decode alone, and the order of the rows changes nothing."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        query, cache, tables, seq_lens = shared_prefix_step(dtype)
        batched = paged_attention.paged_decode(query, cache, tables, seq_lens, 0.125, 0,
                                               SOFTCAP)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(batched.float(), naive(query, cache, tables, seq_lens,
                                                          0.125, 0, SOFTCAP), atol=tol, rtol=tol)
        for b in range(len(seq_lens)):
            alone = paged_attention.paged_decode(query[b:b + 1], cache, tables[b:b + 1],
                                                 seq_lens[b:b + 1], 0.125, 0, SOFTCAP)
            assert torch.equal(alone[0], batched[b]), f"row {b} (length {int(seq_lens[b])})"
        order = torch.randperm(len(seq_lens), generator=torch.Generator().manual_seed(3))
        shuffled = paged_attention.paged_decode(query[order], cache, tables[order],
                                                seq_lens[order], 0.125, 0, SOFTCAP)
        assert torch.equal(shuffled, batched[order])
    finally:
        torch.set_num_threads(previous)
