"""Weight layouts on the CPU: every layout keeps the parameters' values and the model's outputs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_ascend.native import matvec


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
    assert resolve_layout("auto", model.to(torch.bfloat16)) == "row"
    model.float()
    with pytest.raises(ValueError, match="weight_layout"):
        resolve_layout("diagonal", model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    ids = torch.tensor([prompt(70, 12)])
    with torch.inference_mode():
        full_before = model(ids).logits
        last_before = model(ids[:, :1]).logits  # single-row products
        few_before = model(ids[:, :4]).logits  # small-batch products (2-8 rows)
        weights = {name: p.clone() for name, p in model.named_parameters()}
        n = len(linears)
        for layout, expected in (("column", n), ("dual", n), ("dual", 0), ("row", n),
                                 ("dual", n), ("column", n)):
            assert apply_layout(model, layout) == expected
            assert all(current_layout(m) == layout for m in linears)
            for name, p in model.named_parameters():
                assert torch.equal(p, weights[name]), name
            torch.testing.assert_close(model(ids).logits, full_before, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(ids[:, :1]).logits, last_before, atol=1e-5,
                                       rtol=1e-5)
            torch.testing.assert_close(model(ids[:, :4]).logits, few_before, atol=1e-5,
                                       rtol=1e-5)
        apply_layout(model, "row")
        assert all(m.weight.is_contiguous() and "forward" not in m.__dict__ for m in linears)
    apply_layout(model, "dual")
    layer, head = linears[0], model.lm_head  # llama tiny: (128, 128) and (4096, 128)
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
    from langchain_ascend.engine.cpu.weight_layout import single_row_weight

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
