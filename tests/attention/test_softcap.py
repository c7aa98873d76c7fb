"""Gemma 2's attention logit soft-capping (``s -> cap * tanh(s / cap)`` on the scaled scores,
before the softmax) through every backend that runs it, and refused at engine start by one
that cannot (npu)."""

from __future__ import annotations

import pytest
import torch
from _paged_attention_cases import make_case, naive_attention

from langchain_ascend.attention import registry
from langchain_ascend.attention.backends import softcap as capped
from langchain_ascend.attention.backends.base import num_blocks_for
from langchain_ascend.attention.backends.cpu import CPUBackend
from langchain_ascend.attention.backends.npu import NPUBackend
from langchain_ascend.attention.backends.reference import build_decode_metadata, decode_attention
from langchain_ascend.attention.backends.torch_ref import TorchRefBackend
from langchain_ascend.errors import UnsupportedModelFeatureError
from langchain_ascend.native import paged_attention
from langchain_ascend.testing import needs_native_kernels

CAP = 1.0
"""Small next to these random scores (spread about 1): capped and plain results differ."""

STEPS = {
    "gather": dict(segments=[(700, 1), (1030, 1), (5, 1), (333, 1)], block_size=16,
                   pool_slack=40),
    "shared-span": dict(segments=[(40, 1), (41, 1), (53, 1), (97, 1)], block_size=16,
                        allocation="contiguous", shared_prefix=32),
    "shared-runs": dict(segments=[(100, 1), (101, 1), (110, 1)], block_size=4,
                        allocation="gapped", shared_prefix=96),
    "one-run-tail": dict(segments=[(45, 1)], block_size=4, allocation="gapped",
                         shared_prefix=32),
    "mixed": dict(segments=[(7, 1), (16, 1), (0, 1), (33, 1), (0, 9), (5, 12), (16, 3)],
                  block_size=4),
    "prefills": dict(segments=[(40, 20), (0, 33)], block_size=16, pool_slack=8),
}


@pytest.mark.parametrize("window", [None, 10])
@pytest.mark.parametrize("name", sorted(STEPS))
@pytest.mark.parametrize("backend_cls", [TorchRefBackend, CPUBackend], ids=["torch_ref", "cpu"])
def test_backends_soft_cap_every_path(backend_cls, name, window):
    """Decodes (gather, shared view, piecewise runs, the paged kernel) and prefills (fresh,
    after a cached prefix, the paged kernel's rows) give the naive soft-capped attention."""
    case = make_case(backend_cls=backend_cls, seed=5, softcap=CAP, window=window, **STEPS[name])
    out, metadata = case.run(window)
    if backend_cls is TorchRefBackend and name in ("shared-runs", "one-run-tail"):
        assert metadata.decodes.runs is not None  # a step the uncapped path merges by runs
    torch.testing.assert_close(out, case.expected, atol=2e-5, rtol=2e-5)
    plain = torch.cat([naive_attention(q, k, v, c, window) for q, k, v, _, c in case.sequences])
    assert (plain - case.expected).abs().max() > 1e-2  # the cap matters here


@pytest.mark.parametrize("blocks_dim", [1, 2])
def test_reference_decode_soft_caps(blocks_dim):
    """The reference decode path (the static and captured steps run it) applies the cap."""
    case = make_case([(40, 1), (7, 1), (70, 1)], block_size=4, softcap=CAP, window=16)
    need = max(num_blocks_for(n, 4) for n in case.layout.seq_lens)
    metadata = build_decode_metadata(case.layout, width=need + 2,
                                     pad_block=case.kv_cache.shape[2] - 1,
                                     device=torch.device("cpu"))
    cache = case.kv_cache.clone()
    if blocks_dim == 1:  # (2, KVH, nb, bs, D) -> (2, nb, bs, KVH, D)
        cache = cache.permute(0, 2, 3, 1, 4).contiguous()
    out = decode_attention(case.query, case.key, case.value, cache, metadata,
                           case.backend.head_dim ** -0.5, 16, blocks_dim=blocks_dim,
                           softcap=CAP)
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)


def test_reference_decode_soft_caps_in_a_fullgraph_compile():
    """The static step compiles and captures the reference path: the capped scores trace as
    one graph (nothing read back to the host)."""
    case = make_case([(40, 1), (7, 1)], block_size=4, softcap=CAP)
    metadata = build_decode_metadata(case.layout, width=12, pad_block=case.kv_cache.shape[2] - 1,
                                     device=torch.device("cpu"))

    def step(query, key, value, cache):
        return decode_attention(query, key, value, cache, metadata, 0.25, None, blocks_dim=2,
                                softcap=CAP)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    out = compiled(case.query, case.key, case.value, case.kv_cache.clone())
    torch.testing.assert_close(out, case.expected, atol=1e-5, rtol=1e-5)


def test_without_a_cap_the_helper_is_sdpa_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 9, 16, generator=gen) for _ in range(3))
    mask = torch.rand(9, 9, generator=gen) > 0.3
    mask |= torch.eye(9, dtype=torch.bool)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                scale=0.3)
    assert torch.equal(capped.attention(q, k, v, attn_mask=mask, scale=0.3), expected)
    assert torch.equal(capped.attention(q, k, v, attn_mask=mask, scale=0.3, softcap=0.0),
                       expected)
    causal = capped.attention(q, k, v, scale=0.3, softcap=CAP, is_causal=True)
    explicit = capped.attention(q, k, v, scale=0.3, softcap=CAP,
                                attn_mask=torch.ones(9, 9, dtype=torch.bool).tril())
    torch.testing.assert_close(causal, explicit)


@needs_native_kernels()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soft_capped_decodes_get_the_bits_of_each_alone(dtype):
    """Batch invariance with the cap on, through the CPU backend: requests sharing a cached
    prefix and unrelated ones decode in one paged-kernel call, each row bit for bit its
    request's decode alone."""
    segments = [(300, 1), (301, 1), (333, 1), (0, 1), (290, 1)]
    case = make_case(segments, block_size=16, shared_prefix=288, allocation="gapped",
                     num_heads=6, num_kv_heads=2, head_dim=64, dtype=dtype,
                     backend_cls=CPUBackend, softcap=CAP)
    out, metadata = case.run()
    assert metadata.decodes.paged is not None
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), case.expected, atol=tol, rtol=tol)
    block_tables, lens = metadata.decodes.paged
    scale = case.backend.head_dim ** -0.5
    for b in range(len(segments)):
        alone = paged_attention.paged_decode(case.query[b:b + 1], case.kv_cache,
                                             block_tables[b:b + 1], lens[b:b + 1], scale, 0,
                                             CAP)
        assert torch.equal(alone[0], out[b]), f"row {b}"


class _Config:
    model_type = "gemma2"
    _name_or_path = "tiny-gemma2"
    attn_logit_softcapping = 50.0


def test_a_backend_without_a_soft_cap_refuses_the_model_at_start():
    """The npu backend's fused kernel has no soft-cap: the runner refuses a Gemma 2 at start
    with a typed error naming the model and the field (not deep inside a step)."""
    assert not NPUBackend.supports_softcap
    with pytest.raises(UnsupportedModelFeatureError,
                       match="tiny-gemma2.*attn_logit_softcapping=50.0.*npu.*torch_ref"):
        registry.check_backend_runs(NPUBackend, _Config())
    registry.check_backend_runs(TorchRefBackend, _Config())
    registry.check_backend_runs(CPUBackend, _Config())
    uncapped = _Config()
    uncapped.attn_logit_softcapping = None
    registry.check_backend_runs(NPUBackend, uncapped)
