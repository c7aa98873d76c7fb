"""``native.openmp.release_thread_pool`` hands a thread's OpenMP workers back (the engine's
steps then spin on one pool alone)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from langchain_ascend.native import openmp


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_release_frees_the_calling_threads_workers():
    if openmp._pause() is None:
        pytest.skip("no GNU OpenMP runtime with omp_pause_resource_all in this process")
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # two workers beside the thread, whatever the core count
    seen: dict[str, int] = {}

    def work() -> None:
        x = torch.ones(1 << 22)
        (x + x).sum()  # a parallel region: this thread's pool starts its workers
        seen["running"] = _threads()
        seen["released"] = openmp.release_thread_pool()
        seen["after"] = _threads()
        (x + x).sum()  # a new pool on demand
        seen["again"] = _threads()
        openmp.release_thread_pool()

    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen["released"] is True
    assert seen["after"] == seen["running"] - 2
    assert seen["again"] == seen["running"]
