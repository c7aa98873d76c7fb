"""The CPU attention backend: the native kernels on the decode paths, torch_ref's elsewhere."""

from __future__ import annotations

import torch
from _paged_attention_cases import make_case

from langchain_ascend.attention.backends.cpu import CPUBackend
from langchain_ascend.native import decode_attention, paged_attention
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
    # Unrelated contexts and single requests: the paged kernel, every request in one call.
    paged = []
    decode = paged_attention.paged_decode
    monkeypatch.setattr(paged_attention, "paged_decode",
                        lambda *a, **k: paged.append(a[3].tolist()) or decode(*a, **k))
    for allocation in ("contiguous", "shuffled"):
        calls.clear(), paged.clear()
        case = make_case([(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], block_size=4,
                         pool_slack=200, allocation=allocation, backend_cls=CPUBackend)
        out, metadata = case.run()
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        assert metadata.decodes.paged is not None and not calls
        assert paged == [[8, 17, 1, 34]]  # one call, each request over exactly its own keys
    for window in (6, 100):  # a sliding window narrower or wider than the contexts
        paged.clear()
        case = make_case([(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], block_size=4,
                         pool_slack=200, window=window, backend_cls=CPUBackend)
        out, metadata = case.run(window)
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        assert len(paged) == 1
    paged.clear()
    single = make_case([(37, 1)], block_size=4, allocation="gapped", backend_cls=CPUBackend)
    out, _ = single.run()
    torch.testing.assert_close(out, single.expected, atol=1e-5, rtol=1e-5)
    assert len(paged) == 1


@needs_kernel
def test_cpu_backend_runs_bfloat16_decodes_through_the_paged_kernel(monkeypatch):
    paged = []
    decode = paged_attention.paged_decode
    monkeypatch.setattr(paged_attention, "paged_decode",
                        lambda *a, **k: paged.append(1) or decode(*a, **k))
    for shared in (0, 32):  # shared prefixes too: bf16 has no shared-path kernel
        paged.clear()
        case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, shared_prefix=shared,
                         dtype=torch.bfloat16, backend_cls=CPUBackend)
        assert case.backend.paged_native and not case.backend.native
        out, _ = case.run()
        torch.testing.assert_close(out.float(), case.expected.float(), atol=2e-2, rtol=2e-2)
        assert paged == [1]


def test_cpu_backend_runs_torch_ref_paths_when_the_kernel_is_off(monkeypatch):
    monkeypatch.setattr(decode_attention, "available", lambda: False)
    case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, allocation="contiguous",
                     shared_prefix=32, backend_cls=CPUBackend)
    assert not case.backend.native
    out, _ = case.run()
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(paged_attention, "available", lambda dtype: False)
    for dtype in (torch.float32, torch.bfloat16):
        case = make_case([(7, 1), (16, 1), (0, 9)], block_size=4, dtype=dtype,
                         backend_cls=CPUBackend)
        assert not case.backend.native and not case.backend.paged_native
        out, metadata = case.run()
        assert metadata.decodes.paged is None
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), case.expected.float(), atol=tol, rtol=tol)
