"""torch_ref paged attention against naive attention over the full (unpaged) K/V."""

from __future__ import annotations

import pytest
import torch
from _paged_attention_cases import naive_attention, run_case

from langchain_ascend.attention.backends import backend_name_for, get_backend_class
from langchain_ascend.attention.backends.base import BatchLayout
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend


@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_batch_matches_naive(block_size):
    segments = [(7, 1), (16, 1), (0, 1), (33, 1), (0, 9), (5, 12), (16, 3)]
    out, expected, *_ = run_case(segments, block_size=block_size)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_gqa_mqa_and_mha(num_kv_heads):
    out, expected, *_ = run_case([(10, 1), (3, 1), (4, 6)], block_size=4, num_heads=4,
                                 num_kv_heads=num_kv_heads)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_single_decode_and_single_prefill_paths():
    for segments in ([(31, 1)], [(0, 20)], [(12, 20)], [(15, 1), (16, 1)]):
        out, expected, *_ = run_case(segments, block_size=16)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_decodes_of_equal_full_block_lengths_need_no_padding():
    out, expected, *_ = run_case([(15, 1), (31, 1)], block_size=16)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    _, _, _, _, layout = run_case([(15, 1), (15, 1)], block_size=16)
    backend = TorchRefBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                              device=torch.device("cpu"))
    assert backend.build_metadata(layout).decode_bias is None


def test_sliding_window():
    segments = [(20, 1), (3, 1), (0, 14), (9, 8)]
    out, expected, *_ = run_case(segments, block_size=4, window=6)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_new_keys_are_written_at_their_slots():
    _, _, kv_cache, full, layout = run_case([(5, 1), (0, 7)], block_size=4)
    flat = kv_cache.view(2, -1, 2, 16)
    for _q, k, v, slots in full:
        torch.testing.assert_close(flat[0, slots], k)
        torch.testing.assert_close(flat[1, slots], v)


def test_bfloat16_close_to_float32_reference():
    gen = torch.Generator().manual_seed(1)
    backend = TorchRefBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16,
                              device=torch.device("cpu"))
    cache = torch.zeros(backend.kv_cache_shape(4, 4), dtype=torch.bfloat16)
    q = torch.randn(6, 4, 16, generator=gen)
    k = torch.randn(6, 2, 16, generator=gen)
    v = torch.randn(6, 2, 16, generator=gen)
    layout = BatchLayout([0, 6], [6], [[2, 0]], [8, 9, 10, 11, 0, 1], 0, 4)
    out = backend.forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), cache,
                          backend.build_metadata(layout), 0.25)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), naive_attention(q, k, v, 0), atol=3e-2, rtol=3e-2)


def test_backend_selection():
    assert backend_name_for("cpu") == "torch_ref"
    assert backend_name_for("cuda") == "torch_ref"
    assert backend_name_for("npu") == "npu"
    assert backend_name_for("cpu", "torch_ref") == "torch_ref"
    assert get_backend_class("torch_ref") is TorchRefBackend
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        backend_name_for("cpu", "flash")
    with pytest.raises(ValueError, match="num_kv_heads"):
        TorchRefBackend(num_heads=4, num_kv_heads=3, head_dim=8, dtype=torch.float32,
                        device=torch.device("cpu"))
