"""Fused sibling projections: same outputs as the separate layers, in any call order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from langchain_ascend.engine.cpu.fused_projections import fusable, fuse_projections  # noqa: E402
from langchain_ascend.engine.cpu.swap import swapped_by  # noqa: E402
from langchain_ascend.engine.cpu.weight_layout import _linears, make_dual  # noqa: E402


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
    assert fuse_projections(module) == 1
    with torch.inference_mode():
        got = module(x)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    # The members' parameters are views of the fused weight: nothing is held twice.
    fused = swapped_by(module.q_proj).linear
    base = fused.weight.data_ptr()
    assert module.k_proj.weight.data_ptr() == base + 64 * 64 * 4
    assert module.v_proj.weight.data_ptr() == base + 80 * 64 * 4
    # Members are left out of the layout pass; o_proj is not part of a group.
    assert [m for m in _linears(module)] == [module.o_proj]


def test_members_called_alone_or_out_of_order_compute_their_own_product():
    torch.manual_seed(1)
    module = Attention(True)
    x, y = torch.randn(1, 1, 64), torch.randn(1, 1, 64)
    expected_x, expected_y = separate_outputs(module, x), separate_outputs(module, y)
    fuse_projections(module)
    with torch.inference_mode():
        k_first = module.k_proj(y)  # before any q_proj call
        q = module.q_proj(x)
        v_other = module.v_proj(y)  # another input than q_proj's
        k = module.k_proj(x)
    torch.testing.assert_close(k_first, expected_y[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q, expected_x[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v_other, expected_y[2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k, expected_x[1], rtol=1e-5, atol=1e-6)


def test_only_matching_plain_linears_are_fused():
    a = torch.nn.Linear(8, 8)
    assert fusable([a, torch.nn.Linear(8, 4)])
    assert not fusable([a, torch.nn.Linear(8, 4, bias=False)])  # bias mix
    assert not fusable([a, torch.nn.Linear(6, 4)])  # other input size
    assert not fusable([a, torch.nn.Linear(8, 4, dtype=torch.float64)])
    assert not fusable([a, None])
    rewired = torch.nn.Linear(8, 4)
    make_dual(rewired)  # its forward is already swapped
    assert not fusable([a, rewired])
