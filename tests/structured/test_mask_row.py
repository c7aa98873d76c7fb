"""Masking a logits row from xgrammar's packed words on one thread (``mask_row``): the same
row as the unpacked-mask reference, for sparse masks; dense ones are left to xgrammar."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from langchain_ascend.structured.packed_masks import (
    DENSE_MASK_FRACTION,
    mask_row,
    pack_mask,
    unpack_mask,
)


def reference(row: torch.Tensor, packed: np.ndarray, width: int) -> torch.Tensor:
    out = row.clone()
    allowed = torch.from_numpy(unpack_mask(packed, width))
    out[:width].masked_fill_(~allowed, float("-inf"))
    return out


@pytest.mark.parametrize("density", [0.0, 0.0005, 0.05, 0.5, 0.85])
@pytest.mark.parametrize("width", [49152, 49150])
def test_sparse_masks_equal_the_reference(density, width):
    rng = np.random.default_rng(int(density * 1e4) + width)
    allowed = rng.random(width) < density
    packed = pack_mask(allowed)
    row = torch.from_numpy(rng.standard_normal(49152).astype(np.float32))
    want = reference(row, packed, width)
    with torch.inference_mode():  # the engine's logits are inference tensors
        got = row.clone()
        assert mask_row(got.numpy(), packed, width) is True
    assert torch.equal(got, want)
    assert torch.isfinite(got[:width]).sum() == allowed.sum()


def test_dense_mask_is_left_alone():
    width = 1000
    allowed = np.ones(width, dtype=bool)
    allowed[: int(width * (1 - DENSE_MASK_FRACTION)) - 1] = False
    row = np.arange(width, dtype=np.float32)
    assert mask_row(row, pack_mask(allowed), width) is False
    assert np.array_equal(row, np.arange(width, dtype=np.float32))
