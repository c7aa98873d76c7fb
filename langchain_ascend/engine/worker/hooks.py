"""Preparing a freshly loaded model for its device, once: :func:`prepare_hooks`.

On the CPU through :func:`langchain_ascend.engine.cpu.prepare`, elsewhere nothing (plain
hooks). The types it hands the model runner (:class:`ModelHooks`, its :class:`LogitsHead`...)
live in the leaf ``worker.hook_types`` and are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_ascend import platform
from langchain_ascend.engine.cpu import prepare
from langchain_ascend.engine.hook_types import (
    WEIGHT_LAYOUTS,
    HookOptions,
    LogitsHead,
    ModelHooks,
    OwnedModel,
    PlainLogitsHead,
)

if TYPE_CHECKING:
    import torch

    from langchain_ascend.engine.hook_types import PackedStep as PackedStep

__all__ = ["WEIGHT_LAYOUTS", "HookOptions", "LogitsHead", "ModelHooks", "PlainLogitsHead",
           "OwnedModel", "prepare_hooks"]


def prepare_hooks(model: Any, *, device: torch.device, dtype: torch.dtype,
                  options: HookOptions) -> ModelHooks:
    """Prepare ``model`` (already on ``device``, in ``dtype``) once for its device."""
    if platform.device_type(device) == "cpu":
        return prepare(model, device=device, dtype=dtype, options=options)
    return ModelHooks()
