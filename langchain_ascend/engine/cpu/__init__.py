"""The CPU seam: :func:`prepare` readies a loaded model for the CPU, once.

Which step goes where:

* A model of a family we own (``families.Family.owned_model``) whose products are laid out
  for our kernels gets its owned model (``engine.cpu.models``: ``llama.LlamaModel`` for
  Llama, Mistral, Qwen2, Qwen3 and Phi-3, ``gemma.GemmaModel`` for Gemma 2 and 3): its
  weights taken once as plain attributes, and EVERY step of the CPU backend's paged path run
  by it -- for the Llama layer a pure-decode step, or a step that is one prefill segment, in
  one native call over all layers, any other step layer by layer through the same kernels.
  The model runner calls it explicitly (``hooks.owned_model``).
* Any other model (another family, a rotary scaling the owned models do not compute...) runs
  transformers' forward with our paged attention, and its quantized linears compute from
  their blocks; ``stats().weights["forward"]`` says ``"transformers"`` and the log says why.

Before the owned model takes the weights, ``prepare`` fuses sibling projections for it
(``fused_projections``: the owned families only) and lays out the linear weights
(``weight_layout``: ``"dual"`` puts our ``DualLinear`` in place of each ``nn.Linear`` and then
measures up to how many rows the native kernels, bf16 or float32, beat torch -- kernel choice
by measurement lives there; quantized linears are re-laid for the native product). No
module's ``forward`` is replaced. It also makes the screened greedy head (``greedy_head``)
the runner's logits-head strategy. Values and the model code are unchanged. The model runner
sees only the returned :class:`CPUHooks`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.engine.cpu.fused_projections import fuse_projections
from langchain_ascend.engine.cpu.greedy_head import ScreenedGreedyHead
from langchain_ascend.engine.cpu.models.gemma import GemmaModel
from langchain_ascend.engine.cpu.models.llama import LlamaModel
from langchain_ascend.engine.cpu.weight_layout import (
    apply_layout,
    dual_linears,
    resolve_layout,
    tune_bf16_native_rows,
    tune_f32_native_rows,
)
from langchain_ascend.engine.hook_types import (
    HookOptions,
    LogitsHead,
    ModelHooks,
    PlainLogitsHead,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["CPUHooks", "prepare"]

OWNED_MODELS = {"llama": LlamaModel, "gemma": GemmaModel}
"""The owned CPU model of each ``families.Family.owned_model`` value."""


@dataclass
class CPUHooks(ModelHooks):
    """:class:`ModelHooks` of a CPU model; ``changes`` holds ``weight_layout`` (the concrete
    layout), ``fused_groups`` (a count), for a bf16 model on the native
    bf16 kernel ``bf16_native_max_rows`` (the measured row limit, see
    ``weight_layout.tune_bf16_native_rows``), for a float32 model on the native rows kernel
    ``f32_native_max_rows`` (``weight_layout.tune_f32_native_rows``), ``owned_layers``
    (layers the owned model runs, 0: no :attr:`owned_model`) and, once the head is made,
    ``screened_greedy`` (bool).

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
    owner = next((cls for cls in OWNED_MODELS.values() if cls.owns(model)), None)
    owning = owner is not None and layout == "dual"
    groups = fuse_projections(model) if owning else []
    members = [member for group in groups for member in group.members]
    apply_layout(model, layout, skip=members, fused=groups)
    changes: dict[str, Any] = {"weight_layout": layout, "fused_groups": len(groups)}
    dual = dual_linears(model, [group.linear for group in groups])
    for key, tune in (("bf16_native_max_rows", tune_bf16_native_rows),
                      ("f32_native_max_rows", tune_f32_native_rows)):
        native_max_rows = tune(dual) if layout == "dual" else None
        if native_max_rows is not None:
            changes[key] = native_max_rows
    owned = owner.build(model, groups) if owning and owner is not None else None
    if not owning:
        logger.info("no owned CPU model for a %s model (%s): transformers' forward runs every "
                    "step", getattr(getattr(model, "config", None), "model_type", None),
                    "another family" if owner is None else f"the {layout!r} weight layout")
    changes["owned_layers"] = 0 if owned is None else owned.num_layers
    return CPUHooks(changes=changes, owned_model=owned, screen_greedy=options.screen_greedy)
