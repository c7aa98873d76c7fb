"""Spies on the float32 products of the CPU layouts, shared by this folder's tests."""

from __future__ import annotations

import torch

from langchain_ascend.native import matvec


def f32_product_calls(monkeypatch) -> dict[str, list[int]]:
    """Record the row count of every float32 product by the native rows kernel and by oneDNN
    (both still run)."""
    calls: dict[str, list[int]] = {"native": [], "onednn": []}
    kernel, onednn = matvec.matvec_tiles_rows, torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(matvec, "matvec_tiles_rows",
                        lambda tiles, rows, bias: calls["native"].append(rows.shape[0])
                        or kernel(tiles, rows, bias))
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda rows, *args: calls["onednn"].append(rows.shape[0])
                        or onednn(rows, *args))
    return calls
