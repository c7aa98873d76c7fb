"""The rotary + cache-write kernel the owned model's attention calls: transformers' rotary bit
for bit, the right slots written, refusals that write nothing."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from langchain_ascend.native import rope_kv
from langchain_ascend.testing import needs_native_kernels

pytestmark = needs_native_kernels()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_write_equals_transformers_rotary_and_stores_the_slots(dtype):
    gen = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, dim = 5, 6, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    q, k, v = (t.view(tokens, -1, dim) for t in qkv.split(
        [heads * dim, kv_heads * dim, kv_heads * dim], dim=-1))  # strided views, as fused
    angles = torch.randn(tokens, dim // 2, generator=gen) * 20
    emb = torch.cat([angles, angles], dim=-1)  # (T, D)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    cache = torch.zeros(2, kv_heads, 8, 16, dim, dtype=dtype)
    slots = torch.tensor([3, 17, 40, 127, 5])
    got_q, got_k = rope_kv.rope_and_write(q, k, v, cos, sin, slots, cache)
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          cos[None], sin[None])  # (1, H, T, D)
    assert torch.equal(got_q, want_q[0].transpose(0, 1))  # bit for bit, both dtypes
    assert torch.equal(got_k, want_k[0].transpose(0, 1))
    flat = cache.view(2, kv_heads, -1, dim)  # (2, KVH, slots, D)
    assert torch.equal(flat[0][:, slots].transpose(0, 1), got_k)
    assert torch.equal(flat[1][:, slots].transpose(0, 1), v)
    untouched = torch.ones(flat.shape[2], dtype=torch.bool)
    untouched[slots] = False
    assert not flat[:, :, untouched].any()


def test_rope_and_write_refuses_what_it_cannot_read():
    q = torch.randn(2, 4, 32)
    k = v = torch.randn(2, 2, 32)
    cos = sin = torch.randn(2, 32)
    cache = torch.zeros(2, 2, 4, 16, 32)
    with pytest.raises(ValueError, match="slot"):
        rope_kv.rope_and_write(q, k, v, cos, sin, torch.tensor([0, 64]), cache)
    assert rope_kv.rope_and_write(q.double(), k.double(), v.double(), cos.double(),
                                  sin.double(), torch.tensor([0, 1]), cache.double()) is None
    assert rope_kv.rope_and_write(q[:, :, :24], k[:, :, :24], v[:, :, :24], cos[:, :24],
                                  sin[:, :24], torch.tensor([0, 1]), cache[..., :24]) is None
    assert not cache.any()  # nothing written by refused calls
