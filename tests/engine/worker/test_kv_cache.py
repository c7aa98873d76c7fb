"""The CPU KV cache's zeros are the kernel's lazily mapped pages: a pool costs memory only for
the blocks written, reads as zeros, and a forked child's writes stay its own."""

from __future__ import annotations

import os
from types import SimpleNamespace

import psutil
import pytest
import torch

from langchain_ascend.engine.worker.kv_cache import KVCache, lazy_zeros

MIB = 1 << 20


def _rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lazy_zeros_are_zeros_of_the_shape_and_dtype(dtype) -> None:
    tensor = lazy_zeros((3, 4, 5), dtype, "cpu")
    assert (tensor.shape, tensor.dtype, tensor.is_contiguous()) == ((3, 4, 5), dtype, True)
    assert torch.equal(tensor, torch.zeros(3, 4, 5, dtype=dtype))
    tensor[1, 2] = 7
    assert tensor.sum().item() == 35
    assert lazy_zeros((0, 4), dtype, "cpu").shape == (0, 4)


def test_a_large_pool_is_resident_only_where_written() -> None:
    before = _rss()
    tensor = lazy_zeros((64, 1024, 1024), torch.float32, "cpu")  # 256 MiB
    assert _rss() - before < 32 * MIB
    tensor[:8] = 1.0  # 32 MiB written
    grown = _rss() - before
    assert 24 * MIB < grown < 96 * MIB
    del tensor


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writes_its_own_copy() -> None:
    tensor = lazy_zeros((16,), torch.float32, "cpu")
    pid = os.fork()
    if pid == 0:  # the child
        tensor += 5
        os._exit(0 if tensor.sum().item() == 80 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tensor.sum().item() == 0


def test_kv_cache_tensors_are_lazy_on_the_cpu() -> None:
    backend = SimpleNamespace(
        dtype=torch.bfloat16, cache_dtype=torch.bfloat16, device=torch.device("cpu"),
        blocks_dim=1,
        check_block_size=lambda size: None,
        kv_cache_shape=lambda blocks, size: (2, blocks, size, 4, 64))
    before = _rss()
    cache = KVCache(backend, num_layers=8, num_blocks=2048, block_size=16)  # 128 MiB
    assert cache.num_bytes == 8 * 2 * 2048 * 16 * 4 * 64 * 2
    assert _rss() - before < 16 * MIB
    cache.block(3, 7).fill_(1.0)
    assert cache.tensors[3].sum().item() == 2 * 16 * 4 * 64
    assert cache.tensors[2].sum().item() == 0
