"""Weight layouts on the CPU: every layout keeps the parameters' values and the model's outputs."""

from __future__ import annotations

import pytest
import torch
from _product_spies import f32_product_calls
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.cpu.dual_linear import DualLinear
from langchain_ascend.native import matvec
from langchain_ascend.testing import needs_native_kernels


def prompt(seed: int, length: int, vocab: int = 4000) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_weight_layouts_keep_values_and_outputs(tiny_model_paths):
    from langchain_ascend.engine.cpu.weight_layout import (
        apply_layout,
        current_layout,
        resolve_layout,
    )

    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.float32)
    assert resolve_layout("auto", model) == "dual"  # CPU float32, copies fit easily
    assert resolve_layout("column", model) == "column"
    bf16_layout = "dual" if matvec.bf16_available() else "row"  # the native bf16 kernel
    assert resolve_layout("auto", model.to(torch.bfloat16)) == bf16_layout
    assert resolve_layout("auto", model.to(torch.float16)) == "row"
    model.float()
    with pytest.raises(ValueError, match="weight_layout"):
        resolve_layout("diagonal", model)
    def linears():
        return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    n = len(linears())
    ids = torch.tensor([prompt(70, 12)])
    with torch.inference_mode():
        full_before = model(ids).logits
        last_before = model(ids[:, :1]).logits  # single-row products
        few_before = model(ids[:, :4]).logits  # small-batch products (2-8 rows)
        weights = {name: p.clone() for name, p in model.named_parameters()}
        for layout, expected in (("column", n), ("dual", n), ("dual", 0), ("row", n),
                                 ("dual", n), ("column", n)):
            assert apply_layout(model, layout) == expected
            assert len(linears()) == n and all(current_layout(m) == layout for m in linears())
            assert all((type(m) is DualLinear) == (layout == "dual") for m in linears())
            for name, p in model.named_parameters():
                assert torch.equal(p, weights[name]), name
            torch.testing.assert_close(model(ids).logits, full_before, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(ids[:, :1]).logits, last_before, atol=1e-5,
                                       rtol=1e-5)
            torch.testing.assert_close(model(ids[:, :4]).logits, few_before, atol=1e-5,
                                       rtol=1e-5)
        apply_layout(model, "row")
        assert all(m.weight.is_contiguous() and type(m) is torch.nn.Linear for m in linears())
    apply_layout(model, "dual")
    layer, head = linears()[0], model.lm_head  # llama tiny: (128, 128) and (4096, 128)
    assert layer.single_row_transposed is False
    assert layer.single_row_weight.data_ptr() == layer.weight.data_ptr()  # a view, no copy
    if matvec.available():  # native mat-vec: the weight itself, and tiles for the head
        assert (layer.single_row_mode, head.single_row_mode) == ("rows", "tiles")
        assert head.single_row_weight.shape == (512, 128, 8)
    else:  # torch's product over halves, a transposed copy for the head
        assert (layer.single_row_mode, head.single_row_mode) == ("halves", "halves")
        assert head.single_row_transposed is True
        assert head.single_row_weight.shape == (2, 128, 2048)
    assert head.single_row_weight.data_ptr() != head.weight.data_ptr()
    assert layer.weight.is_contiguous() and head.weight.is_contiguous()
    assert layer.packed_weight is not None  # oneDNN copy for products of more than 8 rows
    assert "single_row_weight" not in dict(model.named_parameters())
    assert "packed_weight" not in dict(model.named_parameters())


def test_dual_layout_without_the_native_kernel_keeps_outputs(tiny_model_paths, monkeypatch):
    from langchain_ascend.engine.cpu.weight_layout import apply_layout

    monkeypatch.setattr(matvec, "applies_to", lambda *args: False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["qwen2"], dtype=torch.float32)
    ids = torch.tensor([prompt(71, 9)])
    with torch.inference_mode():
        before = [model(ids).logits, model(ids[:, :1]).logits]
        apply_layout(model, "dual")
        assert {m.single_row_mode for m in model.modules() if hasattr(m, "single_row_mode")} == {
            "halves"}
        after = [model(ids).logits, model(ids[:, :1]).logits]
    for got, want in zip(after, before, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_single_row_weight_halves_reproduce_the_product():
    from langchain_ascend.engine.cpu.dual_linear import single_row_weight

    torch.manual_seed(0)
    row = torch.randn(1, 6)
    for out_features in (4, 5, 48):  # even, odd (one part), output-heavy (transposed copy)
        weight = torch.randn(out_features, 6)
        halves, transposed = single_row_weight(weight)
        assert transposed is (out_features == 48)
        assert halves.shape[0] == (1 if out_features % 2 else 2)
        if transposed:
            product = torch.bmm(row.expand(2, 1, 6), halves).reshape(-1)
        else:
            product = torch.bmm(halves, row.t().expand(halves.shape[0], 6, 1)).reshape(-1)
        torch.testing.assert_close(product, (row @ weight.t())[0])


def bf16_linear_calls(monkeypatch) -> list[tuple[int, ...]]:
    """Record the input shape of every call of the native bf16 kernel (which still runs)."""
    calls: list[tuple[int, ...]] = []
    kernel = matvec.matvec_tiles_rows_bf16

    def recording(tiles, rows, bias):
        calls.append(tuple(rows.shape))
        return kernel(tiles, rows, bias)

    monkeypatch.setattr(matvec, "matvec_tiles_rows_bf16", recording)
    return calls


@needs_native_kernels()
def test_bf16_dual_layout_keeps_the_weights_and_matches_torch(tiny_model_paths, monkeypatch):
    from langchain_ascend.engine.cpu.dual_linear import BF16_TILES
    from langchain_ascend.engine.cpu.weight_layout import (
        BF16_PROBE_ROWS,
        apply_layout,
        bf16_tiled_linears,
        current_layout,
        dual_linears,
        tune_bf16_native_rows,
    )

    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.bfloat16)
    count = len([m for m in model.modules() if isinstance(m, torch.nn.Linear)])
    ids = torch.tensor([prompt(72, 12)])
    with torch.inference_mode():
        before = [model(ids).logits, model(ids[:, :1]).logits]
        weights = {name: p.clone() for name, p in model.named_parameters()}
        assert apply_layout(model, "dual") == count
        linears = dual_linears(model)
        assert len(linears) == count
        assert all(current_layout(m) == "dual" and m.single_row_mode == BF16_TILES
                   for m in linears)
        assert all(m.native_max_rows == 0 for m in linears)  # torch only until measured
        limit = tune_bf16_native_rows(linears)
        assert limit in (0, *BF16_PROBE_ROWS)
        assert all(m.native_max_rows == limit for m in linears)
        for m in bf16_tiled_linears(linears):
            m.native_max_rows = 64  # every product of this test through the kernel
        calls = bf16_linear_calls(monkeypatch)
        after = [model(ids).logits, model(ids[:, :1]).logits]
    assert {rows for rows, _ in calls} == {12, 1}
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), name  # the weights stay as they were
    head = model.lm_head
    assert head.bf16_tiles.shape == (512, 128, 8) and head.weight.is_contiguous()
    assert "bf16_tiles" not in dict(model.named_parameters())
    for got, want in zip(after, before, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    apply_layout(model, "row")
    assert not dual_linears(model)
    assert all(type(m) is torch.nn.Linear for m in model.modules()
               if isinstance(m, torch.nn.Linear))


@needs_native_kernels()
def test_bf16_layers_the_kernel_cannot_take_run_torch(monkeypatch):
    torch.manual_seed(5)
    odd_linear = torch.nn.Linear(16, 12, dtype=torch.bfloat16)  # out % 8 != 0: no tiles
    even_linear = torch.nn.Linear(16, 24, dtype=torch.bfloat16)
    odd = DualLinear(odd_linear.weight, odd_linear.bias, native_max_rows=8)
    even = DualLinear(even_linear.weight, even_linear.bias, native_max_rows=8)
    assert odd.bf16_tiles is None and even.bf16_tiles is not None
    calls = bf16_linear_calls(monkeypatch)
    x = torch.randn(3, 16).bfloat16()
    with torch.inference_mode():
        assert torch.equal(odd(x), torch.nn.functional.linear(x, odd.weight, odd.bias))
        big = torch.randn(9, 16).bfloat16()  # more rows than the limit: torch
        assert torch.equal(even(big), torch.nn.functional.linear(big, even.weight, even.bias))
        strided = torch.randn(2, 32).bfloat16()[:, ::2]
        want = (strided.float() @ even.weight.float().T + even.bias.float()).bfloat16()
        torch.testing.assert_close(even(strided), want, atol=0, rtol=2 ** -7)
    assert calls == [(2, 16)]


@needs_native_kernels()
def test_measured_row_limit_is_the_largest_probe_the_kernel_wins(monkeypatch):
    from langchain_ascend.engine.cpu import weight_layout

    linear = weight_layout.make_dual(torch.nn.Linear(32, 64, dtype=torch.bfloat16))
    native_s = {1: 1.0, 16: 2.0, 64: 9.0, 256: 1.0}  # loses at 64: 256 is never timed
    torch_s = {1: 3.0, 16: 4.0, 64: 5.0, 256: 9.0}
    timed: list[int] = []

    def fake_times(native, reference):
        rows = weight_layout.BF16_PROBE_ROWS[len(timed)]
        timed.append(rows)
        return native_s[rows], torch_s[rows]

    monkeypatch.setattr(weight_layout, "best_times_s", fake_times)
    assert weight_layout.measure_native_max_rows(linear) == 16
    assert timed == [1, 16, 64]
    monkeypatch.setattr(weight_layout, "best_times_s", lambda *fns: (1.0, 1.0))  # a tie: torch
    assert weight_layout.measure_native_max_rows(linear) == 0


def test_best_times_alternate_the_two_products():
    from langchain_ascend.engine.cpu.weight_layout import best_times_s

    order: list[str] = []
    first, second = best_times_s(lambda: order.append("a"), lambda: order.append("b"), 2)
    assert order == ["a", "b"] * 3  # a warm-up of each, then alternating
    assert 0 <= first < 1 and 0 <= second < 1


@needs_native_kernels()
def test_f32_dual_layout_sends_rows_up_to_the_measured_limit_to_the_native_kernel(
        tiny_model_paths, monkeypatch):
    from langchain_ascend.engine.cpu.weight_layout import (
        F32_PROBE_ROWS,
        apply_layout,
        dual_linears,
        f32_tileable_linears,
        set_f32_native_rows,
        tune_f32_native_rows,
    )

    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths["llama"], dtype=torch.float32)
    ids = torch.tensor([prompt(73, 12)])
    with torch.inference_mode():
        before = [model(ids).logits, model(ids[:, :1]).logits]
        apply_layout(model, "dual")
        dual = dual_linears(model)
        linears = f32_tileable_linears(dual)
        assert linears and all(m.out_features % 8 == 0 for m in linears)
        heavy = [m for m in linears if m.single_row_mode == "tiles"]  # the head
        assert heavy and all(m.native_max_rows == 8 and m.f32_tiles is not None for m in heavy)
        limit = tune_f32_native_rows(dual)
        assert limit in (0, *F32_PROBE_ROWS)
        for linear in linears:
            set_f32_native_rows(linear, 16)  # whatever this host measured
        assert all(m.native_max_rows == 16 and m.f32_tiles is not None for m in linears)
        calls = f32_product_calls(monkeypatch)
        after = [model(ids).logits, model(ids[:, :1]).logits]
        assert set(calls["native"]) == {12} and not calls["onednn"]
        for linear in linears:
            set_f32_native_rows(linear, 8)
        calls["native"].clear()
        eight = model(ids).logits
        assert not calls["native"] and set(calls["onednn"]) == {12}
        for linear in linears:
            set_f32_native_rows(linear, 0)  # the kernel loses: only the head keeps tiles
        assert [m for m in linears if m.f32_tiles is not None] == heavy
    for got, want in zip([*after, eight], [*before, before[0]], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    apply_layout(model, "row")
    assert not dual_linears(model)


@needs_native_kernels()
def test_f32_measured_row_limit_stops_at_the_first_loss(monkeypatch):
    from langchain_ascend.engine.cpu import weight_layout

    linear = weight_layout.make_dual(torch.nn.Linear(32, 64))
    assert linear.f32_tiles is None and linear.native_max_rows == 0  # not output-heavy
    native_s = {2: 1.0, 8: 1.0, 16: 2.0, 32: 9.0, 64: 1.0}  # loses at 32: 64 is never timed
    timed: list[int] = []

    def fake_times(native, reference):
        rows = weight_layout.F32_PROBE_ROWS[len(timed)]
        timed.append(rows)
        return native_s[rows], 5.0

    monkeypatch.setattr(weight_layout, "best_times_s", fake_times)
    assert weight_layout.measure_native_max_rows(linear) == 16
    assert timed == [2, 8, 16, 32]
    assert linear.f32_tiles is None  # the probe's tiles were temporary
