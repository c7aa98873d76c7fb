"""Fused sibling projections: one product with the separate layers' outputs, the members
views of it and left with their own forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from langchain_ascend.engine.cpu.dual_linear import DualLinear  # noqa: E402
from langchain_ascend.engine.cpu.fused_projections import (  # noqa: E402
    fusable,
    fuse_projections,
    group_of,
)
from langchain_ascend.engine.cpu.weight_layout import _linears  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 64, bias=bias)
        self.k_proj = torch.nn.Linear(64, 16, bias=bias)
        self.v_proj = torch.nn.Linear(64, 16, bias=bias)
        self.o_proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def separate_outputs(module: Attention, x):
    return [torch.nn.functional.linear(x, m.weight, m.bias)
            for m in (module.q_proj, module.k_proj, module.v_proj)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 4, 20])
def test_fused_group_gives_each_member_its_own_output(bias, rows):
    torch.manual_seed(0)
    module = Attention(bias)
    x = torch.randn(1, rows, 64)
    expected = separate_outputs(module, x)
    groups = fuse_projections(module)
    members = [module.q_proj, module.k_proj, module.v_proj]
    assert len(groups) == 1 and group_of(groups, members) is groups[0]
    assert group_of(groups, members[:2]) is None and group_of(groups, members[::-1]) is None
    group = groups[0]
    assert isinstance(group.linear, DualLinear) and group.sizes == [64, 16, 16]
    with torch.inference_mode():
        got = group.linear(x).split(group.sizes, dim=-1)
        own = module(x)  # the members' own forwards, on their views
    for g, o, e in zip(got, own, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-6)
    # The members' parameters are views of the fused weight: nothing is held twice.
    base = group.linear.weight.data_ptr()
    assert module.k_proj.weight.data_ptr() == base + 64 * 64 * 4
    assert module.v_proj.weight.data_ptr() == base + 80 * 64 * 4
    assert all(type(m) is torch.nn.Linear and "forward" not in m.__dict__ for m in members)
    # Members are left out of the layout pass; o_proj is not part of a group.
    assert [m for m in _linears(module, skip=members)] == [module.o_proj]


def test_only_matching_plain_linears_are_fused():
    a = torch.nn.Linear(8, 8)
    assert fusable([a, torch.nn.Linear(8, 4)])
    assert not fusable([a, torch.nn.Linear(8, 4, bias=False)])  # bias mix
    assert not fusable([a, torch.nn.Linear(6, 4)])  # other input size
    assert not fusable([a, torch.nn.Linear(8, 4, dtype=torch.float64)])
    assert not fusable([a, None])
