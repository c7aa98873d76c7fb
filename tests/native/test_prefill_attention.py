"""The prefill attention kernel against a naive float64 softmax, and its batch invariance."""

from __future__ import annotations

import random

import pytest
import torch

from langchain_ascend.native import prefill_attention
from langchain_ascend.testing import needs_native_kernels

pytestmark = needs_native_kernels()


def naive(query, cache, table, context_len, scale, window=0, softcap=0.0):
    """Each new token over keys ``[lo, p]`` in position order, in float64 -> ``(n, H, D)``;
    with ``softcap`` the scaled scores are soft-capped first (Gemma 2)."""
    n, heads, dim = query.shape
    kv_heads, block_size = cache.shape[1], cache.shape[3]
    group = heads // kv_heads
    slots = [int(table[p // block_size]) * block_size + p % block_size
             for p in range(context_len + n)]
    keys = cache[0].reshape(kv_heads, -1, dim).double()[:, slots]  # (KVH, L, D)
    values = cache[1].reshape(kv_heads, -1, dim).double()[:, slots]
    out = torch.empty(n, heads, dim, dtype=torch.float64)
    for i in range(n):
        p = context_len + i
        lo = max(0, p - window + 1) if window else 0
        q = query[i].double().view(kv_heads, group, dim)  # (KVH, G, D)
        k, v = keys[:, lo: p + 1], values[:, lo: p + 1]  # (KVH, p+1-lo, D)
        scores = q @ k.transpose(1, 2) * scale  # (KVH, G, keys)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        weights = torch.softmax(scores, dim=-1)  # (KVH, G, keys)
        out[i] = (weights @ v).reshape(heads, dim)
    return out.float()


def make_segment(n, context_len, *, heads=9, kv_heads=3, dim=64, block_size=16,
                 cache_dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    needed = -(-(context_len + n) // block_size)
    num_blocks = needed + 6
    cache = torch.randn(2, kv_heads, num_blocks, block_size, dim, generator=gen)
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    table = torch.tensor(ids[:needed], dtype=torch.int32)
    query = 2 * torch.randn(n, heads, dim, generator=gen)
    return query, cache.to(cache_dtype), table


CASES = [
    dict(n=1, context_len=0),
    dict(n=7, context_len=5),
    dict(n=96, context_len=700),  # an agent's turn after a cached prompt
    dict(n=150, context_len=0, block_size=32),  # a fresh prompt, causal only
    dict(n=40, context_len=130, heads=8, kv_heads=2, dim=128, cache_dtype=torch.float32),
    dict(n=33, context_len=64, heads=6, kv_heads=2, dim=40, block_size=8),  # 40: not 32k
    dict(n=20, context_len=3, heads=4, kv_heads=4, dim=32),  # no grouping
    dict(n=70, context_len=10, heads=14, kv_heads=2, dim=64),  # 7 query heads per KV head
    dict(n=9, context_len=20, heads=2, kv_heads=1, dim=8, block_size=1),
    dict(n=11, context_len=70, heads=2, kv_heads=2, dim=256),
    dict(n=5, context_len=33, heads=64, kv_heads=1, dim=16, block_size=5),  # > 48 rows a token
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("window", [0, 1, 50, 64, 65])
def test_prefill_matches_a_naive_softmax(case, window):
    query, cache, table = make_segment(**case)
    scale = query.shape[2] ** -0.5
    out = prefill_attention.prefill(query, cache, table, case["context_len"], scale, window)
    expected = naive(query, cache, table, case["context_len"], scale, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("case", CASES)
def test_the_avx512_and_avx2_products_give_the_same_bits(case):
    if not prefill_attention.wide_products():
        pytest.skip("this CPU has no AVX-512F: only the AVX2 products run here")
    query, cache, table = make_segment(**case)
    scale = query.shape[2] ** -0.5
    wide = prefill_attention.prefill(query, cache, table, case["context_len"], scale, 50)
    was = prefill_attention.force_avx2(True)
    try:
        narrow = prefill_attention.prefill(query, cache, table, case["context_len"], scale, 50)
    finally:
        prefill_attention.force_avx2(was)
    assert torch.equal(wide, narrow)


def test_a_row_does_not_depend_on_the_segment_it_is_computed_in():
    """A prompt cut into chunked-prefill steps, any thread count, a strided query: same bits
    for every token as the whole segment at once."""
    query, cache, table = make_segment(130, 300)
    whole = prefill_attention.prefill(query, cache, table, 300, 0.125)
    threads = torch.get_num_threads()
    try:
        for cuts, count in (([1, 17, 64], 1), ([50], 2), ([129], 3)):
            torch.set_num_threads(count)
            parts, start = [], 0
            for end in [*cuts, 130]:
                parts.append(prefill_attention.prefill(query[start:end], cache, table,
                                                       300 + start, 0.125))
                start = end
            assert torch.equal(torch.cat(parts), whole), cuts
    finally:
        torch.set_num_threads(threads)
    wide = torch.zeros(130, 9, 80)
    wide[:, :, :64] = query
    strided = prefill_attention.prefill(wide[:, :, :64], cache, table, 300, 0.125)
    assert torch.equal(strided, whole)


def test_many_segments_in_one_call_give_each_segment_alone():
    """A step's prefill segments (different contexts, tables, lengths) in one call: each
    segment's rows are bit for bit its call alone."""
    cases = [(96, 700, 1), (5, 40, 2), (130, 0, 3), (1, 9, 4)]
    segments = [make_segment(n, context, seed=seed) for n, context, seed in cases]
    # one cache holding every segment's pages: segment s's blocks shifted past the others'
    caches = [cache for _, cache, _ in segments]
    offsets = [sum(c.shape[2] for c in caches[:i]) for i in range(len(caches))]
    cache = torch.cat(caches, dim=2)
    width = max(len(table) for _, _, table in segments)
    tables = torch.zeros(len(cases), width, dtype=torch.int32)
    rows, first = [], 0
    for index, ((_, _, table), (n, context, _)) in enumerate(zip(segments, cases, strict=True)):
        tables[index, : len(table)] = table + offsets[index]
        rows.append([first, n, context])
        first += n
    query = torch.cat([q for q, _, _ in segments])
    out = prefill_attention.prefill_segments(query, cache, torch.tensor(rows), tables, 0.125)
    for index, ((q, _, table), (n, context, _)) in enumerate(zip(segments, cases, strict=True)):
        alone = prefill_attention.prefill(q, cache, table + offsets[index], context, 0.125)
        start = rows[index][0]
        assert torch.equal(out[start: start + n], alone), cases[index]
        expected = naive(q, cache, table + offsets[index], context, 0.125)
        torch.testing.assert_close(alone, expected, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="runs past"):
        prefill_attention.prefill_segments(query[:-1], cache, torch.tensor(rows), tables, 0.1)


def test_a_nan_query_gives_a_nan_row_and_leaves_the_others_alone():
    query, cache, table = make_segment(12, 40)
    clean = prefill_attention.prefill(query, cache, table, 40, 0.125)
    query[3, 4, 0] = float("nan")
    out = prefill_attention.prefill(query, cache, table, 40, 0.125)
    assert out[3, 4].isnan().all()
    rest = torch.ones(12, 9, dtype=torch.bool)
    rest[3, 4] = False
    assert torch.equal(out[rest], clean[rest])


def test_empty_calls_return_empty_results():
    query, cache, table = make_segment(4, 4)
    assert prefill_attention.prefill(query[:0], cache, table, 4, 0.1).shape == (0, 9, 64)
    none = prefill_attention.prefill_segments(query, cache, torch.zeros(0, 3, dtype=torch.long),
                                              torch.zeros(0, 2, dtype=torch.int32), 0.1)
    assert none.shape == query.shape


def test_bad_tables_raise_a_clear_error():
    query, cache, table = make_segment(10, 40)
    bad = table.clone()
    bad[1] = cache.shape[2]
    with pytest.raises(ValueError, match="block id is outside"):
        prefill_attention.prefill(query, cache, bad, 40, 0.125)
    with pytest.raises(ValueError, match="too short"):
        prefill_attention.prefill(query, cache, table[:2], 40, 0.125)


def test_other_dtypes_and_layouts_are_left_to_the_caller():
    query, cache, table = make_segment(4, 4)
    assert prefill_attention.prefill(query.bfloat16(), cache, table, 4, 0.1) is None
    assert prefill_attention.prefill(query, cache.bfloat16(), table, 4, 0.1) is None
    assert prefill_attention.prefill(query, cache, table.long(), 4, 0.1) is None
    odd, odd_cache, odd_table = make_segment(4, 4, dim=12, heads=2, kv_heads=1)
    assert prefill_attention.prefill(odd, odd_cache, odd_table, 4, 0.1) is None


SOFTCAP = 2.0
"""A cap the scores of these queries (spread about 2) feel: the plain result is far off."""


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [0, 50])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4], CASES[7]])
def test_softcap_matches_the_naive_softcapped_softmax(case, window, cache_dtype):
    """Gemma 2's logit soft-cap on the visible scaled scores, before the online softmax, over
    both cache types, windows included (a hidden key stays hidden, not capped to ``-cap``)."""
    case = dict(case, cache_dtype=cache_dtype)
    query, cache, table = make_segment(**case)
    scale = query.shape[2] ** -0.5
    context = case["context_len"]
    out = prefill_attention.prefill(query, cache, table, context, scale, window, SOFTCAP)
    expected = naive(query, cache, table, context, scale, window, SOFTCAP)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    plain = naive(query, cache, table, context, scale, window)
    assert (plain - expected).abs().max() > 1e-2
    assert torch.equal(prefill_attention.prefill(query, cache, table, context, scale, window,
                                                 0.0),
                       prefill_attention.prefill(query, cache, table, context, scale, window))


def test_softcapped_rows_do_not_depend_on_the_chunking_or_the_threads():
    """Batch invariance with the cap on: a prompt cut into chunked-prefill steps at any thread
    count, and segments sharing one call, give each row the bits of the whole segment alone."""
    query, cache, table = make_segment(130, 300)
    whole = prefill_attention.prefill(query, cache, table, 300, 0.125, 0, SOFTCAP)
    threads = torch.get_num_threads()
    try:
        for cuts, count in (([1, 17, 64], 1), ([50], 2)):
            torch.set_num_threads(count)
            parts, start = [], 0
            for end in [*cuts, 130]:
                parts.append(prefill_attention.prefill(query[start:end], cache, table,
                                                       300 + start, 0.125, 0, SOFTCAP))
                start = end
            assert torch.equal(torch.cat(parts), whole), cuts
    finally:
        torch.set_num_threads(threads)
    other, other_cache, other_table = make_segment(40, 20, seed=5)
    cache2 = torch.cat([cache, other_cache], dim=2)
    width = max(len(table), len(other_table))
    tables = torch.zeros(2, width, dtype=torch.int32)
    tables[0, : len(table)] = table
    tables[1, : len(other_table)] = other_table + cache.shape[2]
    segments = torch.tensor([[0, 130, 300], [130, 40, 20]], dtype=torch.int64)
    both = prefill_attention.prefill_segments(torch.cat([query, other]), cache2, segments,
                                              tables, 0.125, 0, SOFTCAP)
    assert torch.equal(both[:130], whole)
    with pytest.raises(ValueError, match="softcap"):
        prefill_attention.prefill(query, cache, table, 300, 0.125, 0, -2.0)
