"""The native decode-attention kernel against a float64 reference, and its build rules."""

from __future__ import annotations

import math

import pytest
import torch

from langchain_ascend.native import build, decode_attention
from langchain_ascend.testing import needs_native_kernels

needs_kernel = needs_native_kernels()


def reference(q, k, v, bias, scale):
    """``(out (H, R, D), lse (H, R))`` in float64; rows that see no key: 0 and -inf."""
    scores = torch.einsum("hrd,hsd->hrs", q.double(), k.double()) * scale  # (H, R, S)
    if bias is not None:
        scores = scores + bias.double()
    lse = torch.logsumexp(scores, dim=-1)  # (H, R)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hrs,hsd->hrd", weights, v.double()), lse


@needs_kernel
def test_the_kernel_builds_and_loads_where_the_host_allows():
    assert decode_attention.available(), decode_attention.unavailable_reason()
    assert decode_attention.unavailable_reason().startswith("loaded ")


@needs_kernel
@pytest.mark.parametrize(("heads", "rows", "keys", "head_dim"), [
    (1, 1, 1, 8), (2, 4, 7, 64), (2, 4, 64, 64), (2, 4, 65, 64), (4, 7, 513, 32),
    (2, 64, 1100, 64), (1, 3, 2049, 128), (8, 1, 300, 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_attention_over_strided_views(heads, rows, keys, head_dim, threads):
    gen = torch.Generator().manual_seed(heads * 1000 + keys)
    cache = torch.randn(2, heads, keys + 40, head_dim, generator=gen)  # (2, H, slots, D)
    k, v = cache[0, :, 17: 17 + keys], cache[1, :, 17: 17 + keys]  # views: head stride > S*D
    q = torch.randn(heads, rows, head_dim, generator=gen) * 3
    scale = head_dim ** -0.5
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse = decode_attention.attend(q, k, v, None, scale)
    finally:
        torch.set_num_threads(previous)
    want_out, want_lse = reference(q, k, v, None, scale)
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


@needs_kernel
def test_mask_hides_keys_and_rows_that_see_nothing_come_back_empty():
    gen = torch.Generator().manual_seed(7)
    heads, rows, keys, dim = 2, 6, 900, 64
    k, v = torch.randn(2, heads, keys, dim, generator=gen)
    q = torch.randn(heads, rows, dim, generator=gen)
    hidden = torch.rand(rows, keys, generator=gen) < 0.5
    hidden[2] = True  # sees no key at all
    hidden[4, :800] = True  # sees only the last split's keys
    full = torch.zeros(rows, keys + 5).masked_fill_(
        torch.nn.functional.pad(hidden, (0, 5), value=True), float("-inf"))
    bias = full[:, :keys]  # rows of stride keys + 5: a column slice, as the run path passes
    out, lse = decode_attention.attend(q, k, v, bias, 0.125)
    want_out, want_lse = reference(q, k, v, bias, 0.125)
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=2e-5)
    assert torch.isneginf(lse[:, 2]).all() and (out[:, 2] == 0).all()
    seen = [r for r in range(rows) if r != 2]
    torch.testing.assert_close(lse[:, seen].double(), want_lse[:, seen], atol=2e-5, rtol=2e-5)


@needs_kernel
def test_extreme_scores_stay_finite():
    q = torch.full((1, 2, 8), 30.0)
    k = torch.cat([torch.full((1, 5, 8), 3.0), torch.full((1, 5, 8), -3.0)], dim=1)
    v = torch.arange(80, dtype=torch.float32).view(1, 10, 8)
    out, lse = decode_attention.attend(q, k, v, None, 1.0)  # scores +-720: exp under/overflow
    torch.testing.assert_close(out[0, 0], v[0, :5].mean(0))
    assert math.isclose(lse[0, 0].item(), 720 + math.log(5), rel_tol=1e-6)


def test_inputs_the_kernel_does_not_take_are_declined():
    q, k = torch.randn(2, 4, 64), torch.randn(2, 100, 64)
    assert decode_attention.attend(q, k, k, None, 1.0) is None or decode_attention.available()
    if not decode_attention.available():
        return
    assert decode_attention.attend(q.double(), k.double(), k.double(), None, 1.0) is None
    assert decode_attention.attend(q, k.transpose(1, 2).contiguous().transpose(1, 2), k, None,
                                   1.0) is None  # rows not contiguous
    assert decode_attention.attend(torch.randn(2, 4, 12), torch.randn(2, 9, 12),
                                   torch.randn(2, 9, 12), None, 1.0) is None  # D % 8
    assert decode_attention.attend(q, k, k, torch.zeros(4, 100).t().contiguous().t(),
                                   1.0) is None  # bias columns strided


def test_num_splits_gives_each_thread_work_without_tiny_ranges():
    assert decode_attention.num_splits(2, 2400, 2) == 2
    assert decode_attention.num_splits(2, 700, 2) == 1  # not two ranges of 350 keys
    assert decode_attention.num_splits(8, 5000, 2) == 1
    assert decode_attention.num_splits(1, 100_000, 16) == 32


def test_build_name_changes_with_what_shapes_the_binary():
    base = build.library_name("k", b"int x;", "/usr/bin/cc", "/x/libgomp.so.1")
    assert base.startswith("k-") and base.endswith(".so")
    assert base == build.library_name("k", b"int x;", "/usr/bin/cc", "/x/libgomp.so.1")
    assert base != build.library_name("k", b"int y;", "/usr/bin/cc", "/x/libgomp.so.1")
    assert base != build.library_name("k", b"int x;", "/usr/bin/clang", "/x/libgomp.so.1")
    assert base != build.library_name("k", b"int x;", "/usr/bin/cc", "/y/libgomp.so.1")


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(build.DISABLE_ENV_VAR, "0")
    assert build.host_problem() == f"disabled by {build.DISABLE_ENV_VAR}=0"
