"""The NPU backend without an NPU: import guard, block-size rule, and its kernel wiring.

The wiring test swaps in a CPU stand-in for torch_npu that implements the documented
semantics of ``npu_fused_infer_attention_score`` in paged TND mode (cumulative query ends,
per-segment KV lengths, int32 block table, ``sparse_mode=3`` = causal aligned to the end of
each segment's keys) and of ``_npu_reshape_and_cache``; the backend's output must then equal
naive attention. The last test runs the real kernel and is skipped without an NPU.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from _paged_attention_cases import make_case, read_slots

from langchain_ascend.attention.backends.npu import NPUBackend
from langchain_ascend.errors import DeviceUnavailableError


def _fake_fia(query, key, value, *, atten_mask, block_table, input_layout, block_size,
              actual_seq_lengths, actual_seq_lengths_kv, num_key_value_heads, num_heads, scale,
              sparse_mode):
    assert input_layout == "TND" and sparse_mode == 3
    assert block_table.dtype == torch.int32 and atten_mask.shape == (2048, 2048)
    assert isinstance(actual_seq_lengths, list) and isinstance(actual_seq_lengths_kv, list)
    head_dim = query.shape[-1]
    outs, start = [], 0
    for s, end in enumerate(actual_seq_lengths):
        kv_len = actual_seq_lengths_kv[s]
        blocks = block_table[s, : -(-kv_len // block_size)].long()
        k = key[blocks].reshape(-1, num_key_value_heads, head_dim)[:kv_len]
        v = value[blocks].reshape(-1, num_key_value_heads, head_dim)[:kv_len]
        group = num_heads // num_key_value_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        q = query[start:end]
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
        q_pos = torch.arange(kv_len - (end - start), kv_len)[:, None]
        scores = scores.masked_fill(torch.arange(kv_len)[None, :] > q_pos, float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v))
        start = end
    return torch.cat(outs), None


def _fake_reshape_and_cache(key, value, key_cache, value_cache, slots):
    flat = (-1, *key_cache.shape[2:])
    key_cache.view(flat).index_copy_(0, slots.long(), key)
    value_cache.view(flat).index_copy_(0, slots.long(), value)


@pytest.fixture
def fake_torch_npu(monkeypatch):
    module = types.ModuleType("torch_npu")
    module.npu_fused_infer_attention_score = _fake_fia
    module._npu_reshape_and_cache = _fake_reshape_and_cache
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def test_missing_torch_npu_raises_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` fail
    with pytest.raises(DeviceUnavailableError, match="torch_npu"):
        NPUBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float16,
                   device=torch.device("cpu"))


def test_block_size_must_be_a_multiple_of_128():
    assert NPUBackend.preferred_block_size() == 128
    NPUBackend.check_block_size(256)
    for bad in (16, 64, 192, 1024):
        with pytest.raises(ValueError, match="multiple of 128"):
            NPUBackend.check_block_size(bad)


def _replay(backend, case, device=torch.device("cpu"), dtype=torch.float32):
    """Run ``case`` (built for torch_ref) through ``backend`` with a fresh cache of its layout."""
    cache = torch.zeros(backend.kv_cache_shape(case.kv_cache.shape[2], 128), dtype=dtype,
                        device=device)
    for _, k, v, slots, context_len in case.sequences:
        if context_len:
            backend._writer(k[:context_len].to(device, dtype), v[:context_len].to(device, dtype),
                            cache[0], cache[1],
                            torch.tensor(slots[:context_len], dtype=torch.int32, device=device))
    metadata = backend.build_metadata(case.layout)
    out = backend.forward(case.query.to(device, dtype), case.key.to(device, dtype),
                          case.value.to(device, dtype), cache, metadata,
                          backend.head_dim ** -0.5)
    return out, cache, metadata


def test_kernel_wiring_matches_naive_attention(fake_torch_npu):
    case = make_case([(200, 1), (5, 1), (0, 40), (130, 20)], block_size=128)
    backend = NPUBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                         device=torch.device("cpu"))
    out, cache, metadata = _replay(backend, case)
    assert metadata.query_ends == [1, 2, 42, 62] and metadata.seq_lens == [201, 6, 40, 150]
    assert metadata.block_tables.dtype == torch.int32
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
    for _, k, v, slots, _ in case.sequences:
        keys, values = read_slots(cache, slots, 2, 16, NPUBackend.blocks_dim)
        torch.testing.assert_close(keys, k)
        torch.testing.assert_close(values, v)


@pytest.mark.npu
def test_real_npu_kernel_matches_naive_attention():
    from langchain_ascend.platform import probe_npu

    probe = probe_npu()
    if not probe.available:
        pytest.skip(f"no NPU: {probe.reason}")
    case = make_case([(300, 1), (0, 64), (128, 30)], block_size=128, head_dim=128)
    backend = NPUBackend(num_heads=4, num_kv_heads=2, head_dim=128, dtype=torch.float16,
                         device=torch.device("npu:0"))
    out, _, _ = _replay(backend, case, torch.device("npu:0"), torch.float16)
    torch.testing.assert_close(out.float().cpu(), case.expected, atol=2e-2, rtol=2e-2)
