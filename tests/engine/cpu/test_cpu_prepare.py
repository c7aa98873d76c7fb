"""The CPU seam: one prepare() fuses and lays out the products (our own linear classes in the
tree, no forward replaced) and builds the owned model."""

from __future__ import annotations

import pytest
import torch
from _product_spies import f32_product_calls
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.cpu import CPUHooks, prepare
from langchain_ascend.engine.cpu.dual_linear import DualLinear
from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead
from langchain_ascend.engine.cpu.weight_layout import apply_layout, dual_linears
from langchain_ascend.engine.worker.hooks import (
    HookOptions,
    ModelHooks,
    PlainLogitsHead,
    prepare_hooks,
)
from langchain_ascend.native import matvec, rope_kv
from langchain_ascend.testing import needs_native_kernels


def load(tiny_model_paths, arch="qwen2"):
    return AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.float32)


def test_prepare_replaces_no_forward_and_builds_the_owned_model(tiny_model_paths):
    model = load(tiny_model_paths)
    ids = torch.tensor([[5, 17, 300, 41, 9]])
    with torch.inference_mode():
        before = [model(ids).logits, model(ids[:, :1]).logits]
    hooks = prepare(model, device=torch.device("cpu"), dtype=torch.float32,
                    options=HookOptions())
    assert isinstance(hooks, CPUHooks)
    assert hooks.changes["weight_layout"] == "dual"
    layers = model.config.num_hidden_layers
    assert hooks.changes["fused_groups"] == 2 * layers  # q/k/v and gate/up of every layer
    kernels = rope_kv.available(torch.float32)
    owned = hooks.changes["owned_layers"]
    assert (hooks.owned_model is not None) == bool(owned)
    if owned:
        products = [product for layer in hooks.owned_model.layers
                    for product in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        tiled = all(product.f32_tiles is not None for product in products)
        assert owned == (layers if kernels and tiled else 0)  # the stack reads every tile
    # no instance forward anywhere: the runner calls the owned model explicitly, and the
    # linears outside the groups are our DualLinear in the tree (members stay nn.Linear)
    assert not any("forward" in m.__dict__ for m in model.modules())
    attention = model.get_decoder().layers[0].self_attn
    assert type(attention.o_proj) is DualLinear and type(attention.q_proj) is torch.nn.Linear
    with torch.inference_mode():
        after = [model(ids).logits, model(ids[:, :1]).logits]
    for got, want in zip(after, before, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    head = hooks.make_logits_head(model)
    if matvec.available():
        assert isinstance(head, ScreenedGreedyHead) and hooks.changes["screened_greedy"]
    else:
        assert isinstance(head, PlainLogitsHead) and not hooks.changes["screened_greedy"]


def test_options_pick_the_layout_and_the_head(tiny_model_paths):
    model = load(tiny_model_paths, "llama")
    hooks = prepare(model, device=torch.device("cpu"), dtype=torch.float32,
                    options=HookOptions(weight_layout="row", screen_greedy=False))
    assert hooks.changes["weight_layout"] == "row" and hooks.changes["fused_groups"] == 0
    assert isinstance(hooks.make_logits_head(model), PlainLogitsHead)
    assert not dual_linears(model)
    with pytest.raises(ValueError, match="weight_layout"):
        HookOptions(weight_layout="diagonal")


def test_other_devices_get_plain_hooks_and_an_untouched_model(tiny_model_paths):
    model = load(tiny_model_paths)
    for prepare_fn in (prepare, prepare_hooks):
        hooks = prepare_fn(model, device=torch.device("meta"), dtype=torch.float32,
                           options=HookOptions())
        assert type(hooks) is ModelHooks and hooks.changes == {}
        assert isinstance(hooks.make_logits_head(model), PlainLogitsHead)
    assert not dual_linears(model)


def test_the_row_layout_puts_plain_linears_back():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.randn(1, 4)
    expected = model(x)
    prepare(model, device=torch.device("cpu"), dtype=torch.float32,
            options=HookOptions(weight_layout="dual"))
    assert type(model[0]) is DualLinear
    torch.testing.assert_close(model(x), expected)
    apply_layout(model, "row")
    assert type(model[0]) is torch.nn.Linear
    torch.testing.assert_close(model(x), expected)


def greedy_tokens(model, ids, steps: int) -> list[int]:
    """``steps`` greedy tokens after ``ids``, one row per decode step (a KV cache)."""
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        tokens = []
        for _ in range(steps):
            token = out.logits[0, -1].argmax()
            tokens.append(int(token))
            out = model(token.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return tokens


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_prepared_bf16_model_matches_the_unprepared_one(tiny_model_paths, arch, monkeypatch):
    from langchain_ascend.engine.cpu.weight_layout import BF16_PROBE_ROWS, bf16_tiled_linears

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_paths[arch], dtype=torch.bfloat16)
    hooks = prepare(model, device=torch.device("cpu"), dtype=torch.bfloat16,
                    options=HookOptions())
    layers = model.config.num_hidden_layers
    assert hooks.changes["weight_layout"] == "dual"
    assert hooks.changes["fused_groups"] == 2 * layers  # fused in bf16 too
    assert hooks.changes["bf16_native_max_rows"] in (0, *BF16_PROBE_ROWS)
    owned = hooks.owned_model
    assert owned is not None and owned.num_layers == layers
    linears = bf16_tiled_linears(dual_linears(model))
    assert len(linears) == 2 * layers + 1  # o, down per layer; the head (transformers' calls)
    fused = bf16_tiled_linears([p for layer in owned.layers for p in (layer.qkv, layer.gate_up)])
    assert len(fused) == 2 * layers  # q/k/v and gate/up, held by the owned model
    for linear in linears:
        linear.native_max_rows = 16  # whatever this host measured: the kernel for <= 16 rows
    calls = []
    kernel = matvec.matvec_tiles_rows_bf16
    monkeypatch.setattr(matvec, "matvec_tiles_rows_bf16",
                        lambda *args: calls.append(args[1].shape[0]) or kernel(*args))
    ids = torch.tensor([[5, 17, 300, 41, 9, 1000, 77, 3, 250]])
    with torch.inference_mode():
        for rows in (ids, ids[:, :1]):
            got, want = model(rows).logits.float(), plain(rows).logits.float()
            torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
            assert torch.equal(got[0, -1].argmax(), want[0, -1].argmax())
    assert set(calls) == {9, 1}
    assert greedy_tokens(model, ids, 8) == greedy_tokens(plain, ids, 8)


@needs_native_kernels()
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_prepared_f32_model_sends_batched_rows_to_the_native_kernel(tiny_model_paths, arch,
                                                                    monkeypatch):
    from langchain_ascend.engine.cpu.weight_layout import (
        F32_PROBE_ROWS,
        f32_tileable_linears,
        set_f32_native_rows,
    )

    plain = load(tiny_model_paths, arch)
    model = load(tiny_model_paths, arch)
    hooks = prepare(model, device=torch.device("cpu"), dtype=torch.float32,
                    options=HookOptions())
    assert hooks.changes["f32_native_max_rows"] in (0, *F32_PROBE_ROWS)
    layers = model.config.num_hidden_layers
    linears = f32_tileable_linears(dual_linears(model))
    assert len(linears) == 2 * layers + 1  # o, down per layer; the head (transformers' calls)
    ids = torch.tensor([[5, 17, 300, 41, 9, 1000, 77, 3, 250, 12, 8, 640]])  # 12 rows
    calls = f32_product_calls(monkeypatch)
    with torch.inference_mode():
        want = plain(ids).logits
        for limit, route in ((16, "native"), (8, "onednn")):
            for linear in linears:
                set_f32_native_rows(linear, limit)
            calls["native"].clear()
            calls["onednn"].clear()
            torch.testing.assert_close(model(ids).logits, want, atol=1e-5, rtol=1e-5)
            assert len(calls[route]) == len(linears) and set(calls[route]) == {12}
            other = "onednn" if route == "native" else "native"
            assert not calls[other]
