"""torch_ref paged attention against naive attention over the full (unpaged) K/V.

Every case also runs through the CPU backend (torch_ref's paths with the native decode
kernel where it applies), which must give the same answers.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _paged_attention_cases import make_case, read_slots

from langchain_ascend.attention.backends import backend_name_for, get_backend_class
from langchain_ascend.attention.backends.cpu import CPUBackend
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend


@pytest.fixture(params=[TorchRefBackend, CPUBackend], ids=["torch_ref", "cpu"])
def make(request):
    """``make_case`` building its backend from the parametrized class."""
    return functools.partial(make_case, backend_cls=request.param)


MIXED = [(7, 1), (16, 1), (0, 1), (33, 1), (0, 9), (5, 12), (16, 3)]


def takes_paged_path(case, metadata) -> bool:
    """Whether the CPU backend sent this step's decodes to its paged kernel (every decode step
    where it is built, shared prefixes included); torch_ref's own path choice is asserted
    otherwise."""
    paged = metadata.decodes.paged is not None
    assert paged == getattr(case.backend, "paged_native", False)
    return paged


def check(case, window=None, atol=1e-5):
    out, metadata = case.run(window)
    assert out.shape == case.expected.shape
    torch.testing.assert_close(out.float(), case.expected, atol=atol, rtol=atol)
    return metadata


@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_batch_matches_naive_gather_path(block_size, make):
    case = make(MIXED, block_size=block_size, pool_slack=200)
    metadata = check(case)
    decodes = metadata.decodes  # unrelated contexts: each request's pages are gathered
    if not takes_paged_path(case, metadata):
        assert decodes.span is None and decodes.shared_block_ids is None
        assert decodes.block_ids is not None


@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_batch_matches_naive_span_path(block_size, make):
    case = make([(40, 1), (41, 1), (53, 1), (0, 5), (32, 7)], block_size=block_size,
                     allocation="contiguous", shared_prefix=32)
    metadata = check(case)
    if not takes_paged_path(case, metadata):
        assert metadata.decodes.span is not None  # shared prefix: one zero-copy range


@pytest.mark.parametrize("block_size", [4, 16])
def test_shared_prefix_over_scattered_blocks_gathers_the_union_once(block_size, make):
    contexts = (100, 101, 110, 97)
    case = make([(c, 1) for c in contexts] + [(0, 5), (96, 7)], block_size=block_size,
                     shared_prefix=96, pool_slack=200)
    metadata = check(case)
    decodes = metadata.decodes
    if takes_paged_path(case, metadata):
        return
    assert decodes.span is None and decodes.block_ids is None
    tables = [t[: -(-(c + 1) // block_size)] for t, c in zip(case.layout.block_tables[:4], contexts, strict=True)]
    assert decodes.shared_block_ids.tolist() == sorted({b for t in tables for b in t})
    # the 96-token prefix blocks are read once, not once per request
    prefix = 96 // block_size
    assert len(decodes.shared_block_ids) == prefix + sum(len(t) - prefix for t in tables)


@pytest.mark.parametrize("block_size", [4, 16])
def test_few_runs_of_blocks_are_attended_piecewise_without_a_gather(block_size, monkeypatch, make):
    # Three decodes sharing a 32-token prefix, each tail a separate run; the prefill's blocks
    # are not part of the decodes' union.
    segments = [(40, 1), (33, 1), (47, 1), (0, 5)]
    case = make(segments, block_size=block_size, allocation="gapped", shared_prefix=32)
    metadata = check(case)
    decodes = metadata.decodes
    if takes_paged_path(case, metadata):
        return
    assert decodes.runs is not None and len(decodes.runs) == 4  # prefix + three tails
    # every tail run is foreign to the other two requests: their rows must be flagged
    assert decodes.run_empty_rows[0] is None
    for index, empty in enumerate(decodes.run_empty_rows[1:]):
        rows = empty.view(3, 2)  # (B, group)
        assert rows.all(1).tolist() == [b != index for b in range(3)]
    index_select = torch.Tensor.index_select
    calls = []
    monkeypatch.setattr(torch.Tensor, "index_select",
                        lambda *a, **k: calls.append(1) or index_select(*a, **k))
    check(case)
    assert not calls  # views only


@pytest.mark.parametrize(("allocation", "block_size"), [("gapped", 4), ("shuffled", 16)])
def test_single_decode_over_a_few_runs_needs_no_mask(allocation, block_size, make):
    # gapped: a 32-token prefix then a separate tail run; shuffled: 3 blocks in random order
    for window in (None, 6):  # windowed: one gather of its blocks instead
        case = make([(40, 1)], block_size=block_size, allocation=allocation,
                         shared_prefix=32 if allocation == "gapped" else 0, window=window)
        metadata = check(case, window=window)
        decodes = metadata.decodes
        if not takes_paged_path(case, metadata):
            assert decodes.runs is not None and decodes.bias is None
            assert sum(length for _, length, _ in decodes.runs) == 41  # its 41 positions


def test_many_runs_or_a_window_fall_back_to_one_gather(make):
    segments = [(40, 1), (33, 1), (47, 1), (36, 1), (0, 5)]
    case = make(segments, block_size=4, allocation="gapped", shared_prefix=32)
    metadata = check(case)
    assert takes_paged_path(case, metadata) or metadata.decodes.runs is None  # 5 runs > 4
    case = make([(40, 1), (33, 1), (0, 5)], block_size=4, allocation="gapped",
                     shared_prefix=32, window=6)
    metadata = check(case, window=6)
    # built, but windows use the gather
    assert takes_paged_path(case, metadata) or metadata.decodes.runs is not None


def test_single_decode_over_contiguous_blocks_uses_the_span(make):
    case = make([(300, 1)], block_size=16, allocation="contiguous")
    metadata = check(case)
    if not takes_paged_path(case, metadata):
        assert metadata.decodes.span is not None and metadata.decodes.block_ids is None


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("allocation", ["shuffled", "contiguous"])
def test_gqa_mqa_and_mha(num_kv_heads, allocation, make):
    check(make([(10, 1), (3, 1), (4, 6)], block_size=4, num_kv_heads=num_kv_heads,
                    allocation=allocation))


def test_single_segment_paths(make):
    for segments in ([(31, 1)], [(0, 20)], [(12, 20)], [(15, 1), (16, 1)], [(0, 1)]):
        check(make(segments, block_size=16))


def test_decodes_of_full_block_lengths_need_no_padding_mask(make):
    case = make([(15, 1), (15, 1)], block_size=16, pool_slack=200)
    metadata = check(case)
    if not takes_paged_path(case, metadata):
        assert metadata.decodes.span is None and metadata.decodes.bias is None


@pytest.mark.parametrize("allocation", ["shuffled", "contiguous"])
def test_sliding_window(allocation, make):
    segments = [(20, 1), (3, 1), (0, 14), (9, 8)]
    case = make(segments, block_size=4, window=6, allocation=allocation)
    check(case, window=6)


def test_new_keys_are_written_at_their_slots(make):
    case = make([(5, 1), (0, 7)], block_size=4)
    case.run()
    for _, k, v, slots, _ in case.sequences:
        keys, values = read_slots(case.kv_cache, slots, 2, 16, TorchRefBackend.blocks_dim)
        torch.testing.assert_close(keys, k)
        torch.testing.assert_close(values, v)


@pytest.mark.parametrize("allocation", ["shuffled", "contiguous"])
def test_bfloat16_close_to_float32_reference(allocation, make):
    case = make([(9, 1), (0, 6), (4, 5)], block_size=4, dtype=torch.bfloat16,
                     allocation=allocation)
    out, _ = case.run()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), case.expected, atol=5e-2, rtol=5e-2)


def test_backend_selection():
    assert backend_name_for("cpu") == "cpu"
    assert backend_name_for("cuda") == "torch_ref"
    assert backend_name_for("npu") == "npu"
    assert backend_name_for("cpu", "torch_ref") == "torch_ref"
    assert get_backend_class("torch_ref") is TorchRefBackend
    assert get_backend_class("cpu") is CPUBackend
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        backend_name_for("cpu", "flash")
    with pytest.raises(ValueError, match="num_kv_heads"):
        TorchRefBackend(num_heads=4, num_kv_heads=3, head_dim=8, dtype=torch.float32,
                        device=torch.device("cpu"))
