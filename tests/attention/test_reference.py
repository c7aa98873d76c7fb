"""The reference decode path is the oracle: naive attention, both cache layouts, and every
backend's decode path on the same packed batches."""

from __future__ import annotations

import functools

import pytest
import torch
from _paged_attention_cases import make_case, naive_attention, read_slots

from langchain_ascend.attention.backends.base import num_blocks_for
from langchain_ascend.attention.backends.cpu import CPUBackend
from langchain_ascend.attention.backends.reference import (
    ReferenceDecode,
    build_decode_metadata,
    decode_attention,
)
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend

DECODES = {
    "short": [(3, 1), (0, 1), (9, 1)],
    "long": [(700, 1), (1030, 1), (5, 1), (333, 1)],
}


def reference_out(case, *, width=None, window=None, blocks_dim=2):
    """The reference path's output on ``case`` (cache copied, so the case stays untouched)."""
    layout = case.layout
    need = max(num_blocks_for(n, layout.block_size) for n in layout.seq_lens)
    pad_block = case.kv_cache.shape[2] - 1
    metadata = build_decode_metadata(layout, width=width or need, pad_block=pad_block,
                                     device=torch.device("cpu"))
    cache = case.kv_cache.clone()
    if blocks_dim == 1:  # (2, KVH, nb, bs, D) -> (2, nb, bs, KVH, D)
        cache = cache.permute(0, 2, 3, 1, 4).contiguous()
    out = decode_attention(case.query, case.key, case.value, cache, metadata,
                           case.backend.head_dim ** -0.5, window, blocks_dim=blocks_dim)
    if blocks_dim == 1:
        cache = cache.permute(0, 3, 1, 2, 4)
    return out, cache


@pytest.mark.parametrize("name", sorted(DECODES))
@pytest.mark.parametrize("allocation", ["shuffled", "contiguous"])
@pytest.mark.parametrize("blocks_dim", [1, 2])
def test_reference_matches_naive_attention_and_writes_the_slots(name, allocation, blocks_dim):
    case = make_case(DECODES[name], block_size=16, allocation=allocation, pool_slack=5)
    out, cache = reference_out(case, width=80, blocks_dim=blocks_dim)  # wider than needed
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
    keys, values = read_slots(cache, case.layout.slot_mapping, 2, 16, blocks_dim=2)
    assert torch.equal(keys, case.key) and torch.equal(values, case.value)


@pytest.mark.parametrize("backend_cls", [TorchRefBackend, CPUBackend], ids=["torch_ref", "cpu"])
@pytest.mark.parametrize("case_args", [
    dict(segments=DECODES["short"], block_size=4, allocation="shuffled"),
    dict(segments=DECODES["long"], block_size=16, allocation="shuffled", pool_slack=40),
    dict(segments=[(40, 1), (41, 1), (53, 1), (97, 1)], block_size=16, allocation="contiguous",
         shared_prefix=32),
    dict(segments=[(100, 1), (101, 1), (110, 1)], block_size=4, allocation="gapped",
         shared_prefix=96),
    dict(segments=[(1500, 1)], block_size=16, allocation="gapped"),
], ids=["short", "long", "shared-span", "shared-runs", "one-long"])
def test_backends_decode_paths_agree_with_the_reference(backend_cls, case_args):
    case = make_case(backend_cls=backend_cls, seed=3, **case_args)
    expected, expected_cache = reference_out(case)
    out, _ = case.run()  # the backend's own (eager) decode path
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(case.kv_cache, expected_cache)


@pytest.mark.parametrize("blocks_dim", [1, 2])
def test_sliding_window_matches_naive(blocks_dim):
    case = make_case([(40, 1), (7, 1), (70, 1)], block_size=4, window=16)
    expected = torch.cat([naive_attention(q, k, v, c, 16) for q, k, v, _, c in case.sequences])
    out, _ = reference_out(case, window=16, blocks_dim=blocks_dim)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_reference_close_to_float32():
    make = functools.partial(make_case, DECODES["long"], block_size=16, seed=5)
    full, half = make(), make(dtype=torch.bfloat16)
    torch.testing.assert_close(reference_out(half)[0].float(), reference_out(full)[0],
                               atol=3e-2, rtol=3e-2)


def test_metadata_refuses_prefills_and_narrow_tables():
    case = make_case([(3, 1), (0, 4)], block_size=4)
    with pytest.raises(ValueError, match="single-token"):
        build_decode_metadata(case.layout, width=8, pad_block=0, device="cpu")
    case = make_case([(30, 1)], block_size=4)
    with pytest.raises(ValueError, match="wider than the table"):
        build_decode_metadata(case.layout, width=2, pad_block=0, device="cpu")
    with pytest.raises(ValueError, match="blocks_dim"):
        ReferenceDecode(blocks_dim=3)
