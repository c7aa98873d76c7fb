"""Attention backends and the choice between them (no torch import at module load)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_ascend.attention.backends.base import AttentionBackend

_BACKENDS = {
    "torch_ref": "langchain_ascend.attention.backends.torch_ref:TorchRefBackend",
    "cpu": "langchain_ascend.attention.backends.cpu:CPUBackend",
    "npu": "langchain_ascend.attention.backends.npu:NPUBackend",
}
_BY_DEVICE = {"npu": "npu", "cuda": "torch_ref", "cpu": "cpu"}


def backend_name_for(device_type: str, requested: str = "auto") -> str:
    """The backend to use: ``requested`` unless it is ``"auto"``, else the device's default.

    Raises:
        ValueError: ``requested`` names no backend.
    """
    if requested == "auto":
        return _BY_DEVICE.get(device_type, "torch_ref")
    if requested not in _BACKENDS:
        raise ValueError(f"unknown attention backend {requested!r}: use 'auto' or one of "
                         f"{sorted(_BACKENDS)}")
    return requested


def get_backend_class(name: str) -> type[AttentionBackend]:
    """Import and return the backend class registered as ``name``."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: use one of {sorted(_BACKENDS)}")
    module_name, _, class_name = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
