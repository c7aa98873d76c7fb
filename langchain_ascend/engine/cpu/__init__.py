"""The CPU seam: :func:`prepare` readies a loaded model for the CPU, once.

Which step goes where:

* Pure-decode steps of a known family (Llama, Mistral, Qwen2, Qwen3) that the native stack
  takes run through :class:`~langchain_ascend.engine.cpu.decoder.CpuDecoder`, which the model
  runner calls explicitly (``hooks.decoder``): embedding, rotary tables, every layer in one
  native call over the packed weights (float32 / bfloat16 tiles or GGUF blocks), the final
  norm and the LM head.
* Every other step (prefills, mixed steps, the compiled static step, a family the decoder does
  not know) runs the HF forward with our attention. For its speed, ``prepare`` lays out the
  linear weights (``weight_layout``; for ``"dual"`` it then measures up to how many rows the
  native kernels, bf16 or float32, beat torch -- kernel choice by measurement lives there),
  fuses sibling projections (``fused_projections``, with the ``"dual"`` layout) and RMSNorms
  (``fused_norms``), and gives the attention modules (``lean_attention``) and, where all of a
  layer's pieces were prepared, the decoder layers (``lean_layer``) lean forwards, each by
  swapping module instances' ``forward`` through ``swap``. Each step hands the next the
  modules it prepared; the decoder is built from the lean layers. The decoder module itself
  keeps its class forward.

It also makes the screened greedy head (``greedy_head``) the runner's logits-head strategy.
Values, parameters and the model code are unchanged. The model runner sees only the returned
:class:`CPUHooks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.engine.cpu import decoder as cpu_decoder

# Modules, not their functions: prepare() looks these passes up when it runs (so a caller or
# test that swaps one out is heard), and `engine.cpu.lean_attention` stays the module.
from langchain_ascend.engine.cpu import lean_attention, lean_layer
from langchain_ascend.engine.cpu.fused_norms import fuse_rms_norms
from langchain_ascend.engine.cpu.fused_projections import fuse_projections
from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead
from langchain_ascend.engine.cpu.weight_layout import (
    apply_layout,
    resolve_layout,
    tune_bf16_native_rows,
    tune_f32_native_rows,
)
from langchain_ascend.engine.worker.hook_types import (
    HookOptions,
    LogitsHead,
    ModelHooks,
    PlainLogitsHead,
)

if TYPE_CHECKING:
    import torch

__all__ = ["CPUHooks", "prepare"]


@dataclass
class CPUHooks(ModelHooks):
    """:class:`ModelHooks` of a CPU model; ``changes`` holds ``weight_layout`` (the concrete
    layout), ``fused_groups`` and ``fused_norms`` (counts), for a bf16 model on the native
    bf16 kernel ``bf16_native_max_rows`` (the measured row limit, see
    ``weight_layout.tune_bf16_native_rows``), for a float32 model on the native rows kernel
    ``f32_native_max_rows`` (``weight_layout.tune_f32_native_rows``), ``lean_attention``
    and ``lean_layers`` (counts), ``decode_stack`` (layers the native decoder runs, 0: no
    :attr:`decoder`) and, once the head is made, ``screened_greedy`` (bool).

    Attributes:
        screen_greedy: Whether to try the screened greedy head.
    """

    screen_greedy: bool = True

    def make_logits_head(self, model: Any) -> LogitsHead:
        """The screened greedy head where it applies (``greedy_head``), else the plain one."""
        head = ScreenedGreedyHead.for_model(model) if self.screen_greedy else None
        self.changes["screened_greedy"] = head is not None
        return head if head is not None else PlainLogitsHead()


def prepare(model: Any, *, device: torch.device, dtype: torch.dtype,
            options: HookOptions) -> ModelHooks:
    """Prepare ``model`` (on ``device``, in ``dtype``) for the CPU; plain hooks elsewhere.

    Raises:
        ValueError: ``options.weight_layout`` is not a known layout.
    """
    if platform.device_type(device) != "cpu":
        return ModelHooks()

    layout = resolve_layout(options.weight_layout, model)
    fused_groups = fuse_projections(model) if layout == "dual" else 0
    apply_layout(model, layout)
    changes: dict[str, Any] = {"weight_layout": layout, "fused_groups": fused_groups}
    for key, tune in (("bf16_native_max_rows", tune_bf16_native_rows),
                      ("f32_native_max_rows", tune_f32_native_rows)):
        native_max_rows = tune(model) if layout == "dual" else None
        if native_max_rows is not None:
            changes[key] = native_max_rows
    norms = fuse_rms_norms(model)
    attention = lean_attention.lean_attention(model)
    layers = lean_layer.lean_layers(model, attention, norms)
    decoder = cpu_decoder.CpuDecoder.build(model, layers)
    changes.update(fused_norms=len(norms), lean_attention=len(attention),
                   lean_layers=len(layers),
                   decode_stack=0 if decoder is None else decoder.num_layers)
    return CPUHooks(changes=changes, decoder=decoder, screen_greedy=options.screen_greedy)
