"""The CPU attention backend: the native kernel on the decode paths, torch_ref's elsewhere."""

from __future__ import annotations

import torch
from _paged_attention_cases import make_case

from langchain_ascend.attention.backends.cpu import CPUBackend
from langchain_ascend.native import decode_attention
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


@needs_kernel
def test_cpu_backend_uses_the_kernel_on_every_decode_path_and_torch_elsewhere(monkeypatch):
    calls = []
    attend = decode_attention.attend
    monkeypatch.setattr(decode_attention, "attend",
                        lambda *a: calls.append(a[1].shape[1]) or attend(*a))
    # Decodes over one span of blocks, then over a shared prefix plus separate tails (runs).
    for allocation in ("contiguous", "gapped"):
        calls.clear()
        case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, allocation=allocation,
                         shared_prefix=32, backend_cls=CPUBackend)
        assert case.backend.native
        out, metadata = case.run()
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        expected_calls = 1 if allocation == "contiguous" else len(metadata.decodes.runs)
        assert len(calls) == expected_calls
    # Unrelated contexts (torch_ref's padded gather): request by request, over a view where
    # its blocks are one run (contiguous allocation) or its own gathered pages (shuffled).
    for allocation in ("contiguous", "shuffled"):
        calls.clear()
        case = make_case([(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], block_size=4,
                         pool_slack=200, allocation=allocation, backend_cls=CPUBackend)
        out, metadata = case.run()
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        assert metadata.decodes.block_ids is not None
        assert calls == [8, 17, 1, 34]  # each request over exactly its own keys
    calls.clear()  # a sliding window narrower than the contexts: torch_ref's masked gather
    case = make_case([(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], block_size=4, pool_slack=200,
                     window=6, backend_cls=CPUBackend)
    out, metadata = case.run(6)
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
    assert metadata.decodes.block_ids is not None and not calls


def test_cpu_backend_runs_torch_ref_paths_when_the_kernel_is_off(monkeypatch):
    monkeypatch.setattr(decode_attention, "available", lambda: False)
    case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, allocation="contiguous",
                     shared_prefix=32, backend_cls=CPUBackend)
    assert not case.backend.native
    out, _ = case.run()
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
    bf16 = make_case([(9, 1)], block_size=4, dtype=torch.bfloat16, backend_cls=CPUBackend)
    assert not bf16.backend.native
