"""The CPU seam: one prepare() lays out the products (one swap, one marker) and builds the owned
model."""

from __future__ import annotations

import pytest
import torch
from _product_spies import f32_product_calls
from transformers import AutoModelForCausalLM

from langchain_ascend.engine.cpu import CPUHooks, prepare
from langchain_ascend.engine.cpu.fused_projections import FusedProjections
from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead
from langchain_ascend.engine.cpu.swap import MARKER, is_swapped, restore_forward, swapped_by
from langchain_ascend.engine.cpu.weight_layout import DUAL, dual_linears
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


def test_prepare_swaps_every_prepared_module_under_the_one_marker(tiny_model_paths):
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
    tiled = all(linear.f32_tiles is not None for linear in dual_linears(model))
    owned = hooks.changes["owned_layers"]  # the owned model's stack needs every product's
    assert owned == (layers if kernels and tiled else 0)  # tiles (the measurement may drop)
    swapped = [m for m in model.modules() if is_swapped(m)]
    assert swapped and all(MARKER in m.__dict__ and "forward" in m.__dict__ for m in swapped)
    owners = {type(swapped_by(m)).__name__ if not isinstance(swapped_by(m), str)
              else swapped_by(m) for m in swapped}
    assert owners == {DUAL, FusedProjections.__name__}  # the products only
    # the owned model is no swap: the layers, norms and attention keep their class
    # forwards, the runner calls the owned model (hooks.owned_model) explicitly
    assert not any(is_swapped(m) for m in model.get_decoder().layers)
    assert (hooks.owned_model is not None) == bool(owned)
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
    assert not any(swapped_by(m) == DUAL for m in model.modules())
    with pytest.raises(ValueError, match="weight_layout"):
        HookOptions(weight_layout="diagonal")


def test_other_devices_get_plain_hooks_and_an_untouched_model(tiny_model_paths):
    model = load(tiny_model_paths)
    for prepare_fn in (prepare, prepare_hooks):
        hooks = prepare_fn(model, device=torch.device("meta"), dtype=torch.float32,
                           options=HookOptions())
        assert type(hooks) is ModelHooks and hooks.changes == {}
        assert isinstance(hooks.make_logits_head(model), PlainLogitsHead)
    assert not any(is_swapped(m) for m in model.modules())


def test_restore_forward_drops_the_swap_and_its_marker():
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(1, 4)
    expected = linear(x)
    prepare(torch.nn.Sequential(linear), device=torch.device("cpu"), dtype=torch.float32,
            options=HookOptions(weight_layout="dual"))
    assert swapped_by(linear) == DUAL
    restore_forward(linear)
    assert not is_swapped(linear)
    torch.testing.assert_close(linear(x), expected)


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
    linears = bf16_tiled_linears(model)
    assert len(linears) == 4 * layers + 1  # qkv, o, gate/up, down per layer; the head
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
    linears = f32_tileable_linears(model)
    assert len(linears) == 4 * layers + 1  # fused qkv, o, fused gate/up, down; the head
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
