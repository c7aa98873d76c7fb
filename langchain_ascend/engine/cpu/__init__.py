"""The CPU seam: :func:`prepare` readies a loaded model for the CPU decode step, once.

It lays out the linear weights (``weight_layout``; for ``"dual"`` it then measures up to
how many rows the native kernels, bf16 or float32, beat torch), fuses sibling projections
(``fused_projections``, with the ``"dual"`` layout) and RMSNorms (``fused_norms``) and gives
the attention modules of known families a lean forward (``lean_attention``: rotary embedding
and cache write in one native call) and, where all of a decoder layer's pieces were
prepared, the layer itself a lean forward (``lean_layer``: the same pieces called directly,
without transformers' module calls) and, where every layer is lean, the decoder a forward
that runs all layers of a pure-decode step in one native call (``decode_stack``), each by
swapping module instances' ``forward`` through
``swap``, and builds the screened greedy head (``greedy_head``) as the runner's logits-head
strategy. Values, parameters and the model code
are unchanged. The model runner sees only the returned :class:`CPUHooks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
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
    and ``lean_layers`` (counts), ``decode_stack`` (layers the native stack runs, 0: none)
    and, once the head is made, ``screened_greedy`` (bool).

    Attributes:
        screen_greedy: Whether to try the screened greedy head.
    """

    screen_greedy: bool = True

    def make_logits_head(self, model: Any) -> LogitsHead:
        """The screened greedy head where it applies (``greedy_head``), else the plain one."""
        from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead

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
    from langchain_ascend.engine.cpu.decode_stack import native_decode_stack
    from langchain_ascend.engine.cpu.fused_norms import fuse_rms_norms
    from langchain_ascend.engine.cpu.fused_projections import fuse_projections
    from langchain_ascend.engine.cpu.lean_attention import lean_attention
    from langchain_ascend.engine.cpu.lean_layer import lean_layers
    from langchain_ascend.engine.cpu.weight_layout import (
        apply_layout,
        resolve_layout,
        tune_bf16_native_rows,
        tune_f32_native_rows,
    )

    layout = resolve_layout(options.weight_layout, model)
    fused_groups = fuse_projections(model) if layout == "dual" else 0
    apply_layout(model, layout)
    changes: dict[str, Any] = {"weight_layout": layout, "fused_groups": fused_groups}
    for key, tune in (("bf16_native_max_rows", tune_bf16_native_rows),
                      ("f32_native_max_rows", tune_f32_native_rows)):
        native_max_rows = tune(model) if layout == "dual" else None
        if native_max_rows is not None:
            changes[key] = native_max_rows
    changes["fused_norms"] = fuse_rms_norms(model)
    changes["lean_attention"] = lean_attention(model)
    changes["lean_layers"] = lean_layers(model)
    changes["decode_stack"] = native_decode_stack(model)
    return CPUHooks(changes=changes, screen_greedy=options.screen_greedy)
