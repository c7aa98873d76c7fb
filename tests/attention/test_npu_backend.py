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
from _paged_attention_cases import run_case

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


def test_kernel_wiring_matches_naive_attention(fake_torch_npu):
    segments = [(200, 1), (5, 1), (0, 40), (130, 20)]
    # Reuse the reference case's data and layout, then replay it through the NPU backend.
    _, expected, _, full, layout = run_case(segments, block_size=128, head_dim=16)
    backend = NPUBackend(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                         device=torch.device("cpu"))
    cache = torch.zeros(backend.kv_cache_shape(16, 128))
    flat = cache.view(2, -1, 2, 16)
    for (context_len, _), (_, k, v, slots) in zip(segments, full, strict=True):
        flat[0, slots[:context_len]] = k[:context_len]
        flat[1, slots[:context_len]] = v[:context_len]
    query = torch.cat([q for q, _, _, _ in full])
    key = torch.cat([k[c:] for (c, _), (_, k, _, _) in zip(segments, full, strict=True)])
    value = torch.cat([v[c:] for (c, _), (_, _, v, _) in zip(segments, full, strict=True)])
    metadata = backend.build_metadata(layout)
    assert metadata.query_ends == [1, 2, 42, 62] and metadata.seq_lens == [201, 6, 40, 150]
    out = backend.forward(query, key, value, cache, metadata, 16 ** -0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for _q, k, _v, slots in full:
        torch.testing.assert_close(flat[0, slots], k)


@pytest.mark.npu
def test_real_npu_kernel_matches_torch_ref():
    from langchain_ascend.platform import probe_npu

    probe = probe_npu()
    if not probe.available:
        pytest.skip(f"no NPU: {probe.reason}")
    from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
    segments = [(300, 1), (0, 64), (128, 30)]
    _, _, _, full, layout = run_case(segments, block_size=128, head_dim=128)
    device, dtype = torch.device("npu:0"), torch.float16
    results = []
    for cls in (NPUBackend, TorchRefBackend):
        backend = cls(num_heads=4, num_kv_heads=2, head_dim=128, dtype=dtype, device=device)
        cache = torch.zeros(backend.kv_cache_shape(16, 128), dtype=dtype, device=device)
        flat = cache.view(2, -1, 2, 128)
        for (c, _), (_, k, v, slots) in zip(segments, full, strict=True):
            flat[0, slots[:c]] = k[:c].to(device, dtype)
            flat[1, slots[:c]] = v[:c].to(device, dtype)
        q = torch.cat([q for q, _, _, _ in full]).to(device, dtype)
        k = torch.cat([k[c:] for (c, _), (_, k, _, _) in zip(segments, full, strict=True)])
        v = torch.cat([v[c:] for (c, _), (_, _, v, _) in zip(segments, full, strict=True)])
        results.append(backend.forward(q, k.to(device, dtype), v.to(device, dtype), cache,
                                       backend.build_metadata(layout), 128 ** -0.5).float().cpu())
    torch.testing.assert_close(results[0], results[1], atol=2e-2, rtol=2e-2)
