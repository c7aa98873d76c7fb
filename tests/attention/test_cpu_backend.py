"""The CPU attention backend: the paged kernel for every decode and (float32) every prefill
token, torch_ref's paths elsewhere."""

from __future__ import annotations

import pytest
import torch
from _paged_attention_cases import make_case

from langchain_ascend.attention.backends.cpu import CPUBackend, CPUMetadata
from langchain_ascend.native import paged_attention
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


@pytest.fixture
def paged_calls(monkeypatch):
    """The seq_lens of each paged-kernel call (a list of lists)."""
    calls = []
    decode = paged_attention.paged_decode
    monkeypatch.setattr(paged_attention, "paged_decode",
                        lambda *a, **k: calls.append(a[3].tolist()) or decode(*a, **k))
    return calls


@needs_kernel
def test_every_decode_step_runs_the_paged_kernel_in_one_call(monkeypatch, paged_calls):
    # Decodes over a shared prefix (one span of blocks, or the prefix plus separate tails),
    # unrelated contexts, single requests: every request over exactly its own keys.
    # The step's prefill tokens follow in a call of their own (see the prefill tests).
    steps = [(dict(segments=[(40, 1), (41, 1), (0, 5)], shared_prefix=32,
                   allocation=allocation), [41, 42]) for allocation in ("contiguous", "gapped")]
    steps += [(dict(segments=[(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], pool_slack=200,
                    allocation=allocation), [8, 17, 1, 34])
              for allocation in ("contiguous", "shuffled")]
    steps.append((dict(segments=[(37, 1)], allocation="gapped"), [38]))
    for kwargs, lens in steps:
        paged_calls.clear()
        case = make_case(block_size=4, backend_cls=CPUBackend, **kwargs)
        out, metadata = case.run()
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        assert metadata.decodes.paged is not None
        assert paged_calls[0] == lens, kwargs
    for window in (6, 100):  # a sliding window narrower or wider than the contexts
        paged_calls.clear()
        case = make_case([(7, 1), (16, 1), (0, 1), (33, 1), (0, 9)], block_size=4,
                         pool_slack=200, window=window, backend_cls=CPUBackend)
        out, metadata = case.run(window)
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        assert paged_calls == [[8, 17, 1, 34], list(range(1, 10))]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decodes_sharing_a_prefix_get_the_bits_of_each_alone(dtype):
    """Batch invariance through the backend: requests sharing a cached prefix attend it in one
    kernel call and each row is bit for bit what that request's decode alone gives."""
    segments = [(300, 1), (301, 1), (333, 1), (0, 1), (290, 1)]
    case = make_case(segments, block_size=16, shared_prefix=288, allocation="gapped",
                     num_heads=6, num_kv_heads=2, head_dim=64, dtype=dtype,
                     backend_cls=CPUBackend)
    out, metadata = case.run()
    assert metadata.decodes.paged is not None
    scale = case.backend.head_dim ** -0.5
    block_tables, lens = metadata.decodes.paged
    for b in range(len(segments)):
        alone = paged_attention.paged_decode(case.query[b:b + 1], case.kv_cache,
                                             block_tables[b:b + 1], lens[b:b + 1], scale)
        assert torch.equal(alone[0], out[b]), f"row {b}"


@needs_kernel
def test_cpu_backend_runs_bfloat16_decodes_through_the_paged_kernel(paged_calls):
    for shared in (0, 32):
        paged_calls.clear()
        case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, shared_prefix=shared,
                         dtype=torch.bfloat16, backend_cls=CPUBackend)
        assert case.backend.paged_native
        out, _ = case.run()
        torch.testing.assert_close(out.float(), case.expected.float(), atol=2e-2, rtol=2e-2)
        assert paged_calls == [[41, 42]]


def test_cpu_backend_runs_torch_ref_paths_when_the_kernel_is_off(monkeypatch):
    monkeypatch.setattr(paged_attention, "available", lambda *dtypes: False)
    for dtype in (torch.float32, torch.bfloat16):
        for shared in (0, 32):
            case = make_case([(40, 1), (41, 1), (0, 5)], block_size=4, dtype=dtype,
                             shared_prefix=shared, backend_cls=CPUBackend)
            assert not case.backend.paged_native
            out, metadata = case.run()
            assert metadata.decodes.paged is None
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out.float(), case.expected.float(), atol=tol, rtol=tol)


@needs_kernel
def test_prefill_tokens_run_the_paged_kernel_as_decodes(paged_calls):
    """Fresh prompts and chunks after a cached prefix, alone or next to decodes, windowed or
    not: each prefill segment's tokens in one paged-kernel call, each with its own length
    (its context, itself included) over the segment's blocks."""
    for segments, window in (([(0, 9)], None), ([(40, 1), (20, 7), (0, 5)], None),
                             ([(33, 12), (2, 30)], 10)):
        paged_calls.clear()
        case = make_case(segments, block_size=4, pool_slack=64, allocation="shuffled",
                         window=window, backend_cls=CPUBackend)
        assert case.backend.prefill_native
        out, metadata = case.run(window)
        assert isinstance(metadata, CPUMetadata)
        torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
        lens = [[context + i + 1 for i in range(new)] for context, new in segments if new > 1]
        assert paged_calls[-len(lens):] == lens  # a call per prefill segment


@needs_kernel
def test_a_prefilled_token_has_the_bits_of_its_decode():
    """A prompt's token attends exactly as the one-row decode at its position would: the keys
    and values a hop's output left in the cache and the same text prefilled after an eviction
    give the same bits (greedy text is the same whichever way the cache was filled)."""
    segments = [(20, 7), (0, 40)]
    case = make_case(segments, block_size=16, pool_slack=64, allocation="shuffled",
                     num_heads=6, num_kv_heads=2, head_dim=64, backend_cls=CPUBackend)
    out, metadata = case.run()
    scale = case.backend.head_dim ** -0.5
    row = 0
    for lens, tables in metadata.prefill_calls:
        for i in range(len(lens)):
            alone = paged_attention.paged_decode(  # its own table row: read as a decode's
                case.query[row:row + 1], case.kv_cache, tables[i:i + 1].contiguous(),
                lens[i:i + 1], scale)
            assert torch.equal(alone[0], out[row]), f"row {row}"
            row += 1
    assert row == out.shape[0]


def test_prefills_run_torch_ref_without_the_paged_kernel(monkeypatch):
    monkeypatch.setattr(paged_attention, "available", lambda *dtypes: False)
    case = make_case([(20, 7), (0, 5)], block_size=4, backend_cls=CPUBackend)
    assert not case.backend.prefill_native
    out, metadata = case.run()
    assert not isinstance(metadata, CPUMetadata)
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)
