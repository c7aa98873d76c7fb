"""Handing back a thread's OpenMP pool, so the thread that runs the engine's steps spins alone.

GNU OpenMP (libgomp, torch's and so our kernels') keeps one pool of worker threads per thread
that ever started a parallel region, alive until that thread exits. While the worker threads
of all pools outnumber the CPUs it "throttles": a worker waiting at a barrier spins 1,000
rounds instead of 300,000 before it sleeps on a futex, whatever ``GOMP_SPINCOUNT`` says. A
decode step is ~100 parallel regions of a few hundred microseconds each, so a throttled pool
sleeps and wakes twice a region: on a 2-core VM, one decode row of a 1B Q4_0 model ran at
32-36 tok/s on the engine's loop thread while the constructing thread's pool (from the load)
lived, 47-53 tok/s once that thread had handed its pool back (5,200 context switches a
second against 17; docs/performance.md).

:func:`release_thread_pool` hands the calling thread's pool back (``omp_pause_resource_all``,
OpenMP 5.0: libgomp frees the caller's pool and its threads). The package calls it where its
own OpenMP work ends on a thread that will not run the next steps: after constructing an
engine, after a caller's ``generate`` (it drove its steps), after submitting a stream or a
coroutine's request (the loop thread runs it), after a CPU embedding batch
(``engine.llm_engine``, ``embeddings``). A later parallel region on that thread makes a new
pool (a thread start, ~0.1 ms).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

from langchain_ascend.native import build

logger = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1
"""``omp_pause_soft``: free the pool's threads; the runtime stays initialised."""


@functools.lru_cache(maxsize=1)
def _pause() -> Any:
    """``omp_pause_resource_all`` of the OpenMP runtime torch (and our kernels) use, or None
    where there is none or it lacks the call."""
    try:
        path = build.openmp_runtime()
        if path is None:
            return None
        function = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def release_thread_pool() -> bool:
    """Hand back the calling thread's OpenMP worker threads (module docstring); whether the
    runtime did (False: no such runtime, or the thread is inside a parallel region)."""
    pause = _pause()
    if pause is None:
        return False
    released = pause(OMP_PAUSE_SOFT) == 0
    logger.debug("OpenMP pool of this thread %s", "handed back" if released else "kept")
    return released
