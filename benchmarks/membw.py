"""The memory-bandwidth floor of batch-1 decode: what the machine reads per second, and what a
decode step must read.

A batch-1 decode step reads every weight once, so ``bandwidth / bytes_per_step`` is the most
tokens per second any engine can decode on this machine; a benchmark reports each side's decode
speed as a fraction of it (``fraction_of_floor``).

* :func:`read_bandwidth_gbs`: a streaming read (a sum over a buffer far larger than the last
  level cache, 2 GiB by default) with the given number of threads, by a tiny C loop compiled
  here (``cc -O3 -mavx2 -fopenmp``: AVX2 loads; never ``-march=native``, which may emit AMX on
  VMs that trap it) and cached beside the shaped GGUF files; the best of a few passes. Falls
  back to ``torch.sum`` where no C compiler is found (it reads ~10-25% slower: a floor measured
  that way is lower, the fractions higher).
* :func:`decode_step_bytes`: from the GGUF tensor table, the bytes of every weight tensor but
  the token embedding table (a step reads one row of it, counted) -- unless the file has no
  ``output.weight``: the LM head then reads the whole (tied) table, which is counted. The KV
  cache read (a few MB at the short contexts benchmarked) is left out.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

_C_SOURCE = r"""
#include <stddef.h>
#include <omp.h>
/* Sum n floats with `threads` threads, `passes` times; returns the best seconds per pass. */
double membw_read(const float *p, size_t n, int threads, int passes, float *sink) {
    double best = 1e30;
    for (int r = 0; r < passes; r++) {
        double t0 = omp_get_wtime();
        float total = 0.0f;
        #pragma omp parallel for num_threads(threads) reduction(+:total) schedule(static)
        for (size_t i = 0; i < n; i++) total += p[i];
        double t = omp_get_wtime() - t0;
        *sink += total;
        if (t < best) best = t;
    }
    return best;
}
"""


def _library() -> ctypes.CDLL | None:
    from gguf_shapes import cache_dir

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(_C_SOURCE.encode()).hexdigest()[:12]
    lib = cache_dir() / f"membw-{digest}.so"
    if not lib.exists():
        src = lib.with_suffix(".c")
        src.write_text(_C_SOURCE)
        flags = ["-O3", "-mavx2", "-mfma", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]
        built = subprocess.run([compiler, *flags, str(src), "-o", str(lib)], capture_output=True)
        if built.returncode != 0:
            return None
    so = ctypes.CDLL(str(lib))
    so.membw_read.restype = ctypes.c_double
    so.membw_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_float)]
    return so


def read_bandwidth_gbs(threads: int, *, mib: int = 2048, passes: int = 5) -> tuple[float, str]:
    """Best read bandwidth (GB/s, 1e9 bytes) over a ``mib`` MiB buffer, and how it was read."""
    import numpy as np

    buffer = np.ones(mib * 2**20 // 4, dtype=np.float32)  # touched: every page resident
    so = _library()
    if so is not None:
        sink = ctypes.c_float(0.0)
        seconds = so.membw_read(buffer.ctypes.data, buffer.size, threads, passes,
                                ctypes.byref(sink))
        return buffer.nbytes / seconds / 1e9, "c-avx2-openmp"
    import torch

    torch.set_num_threads(threads)
    tensor = torch.from_numpy(buffer)
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        tensor.sum()
        best = min(best, time.perf_counter() - t)
    return buffer.nbytes / best / 1e9, "torch.sum"


def decode_step_bytes(path: str | Path) -> dict:
    """What one batch-1 decode step of the GGUF file at ``path`` reads (see the module doc)."""
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    embedding = tensors.get("token_embd.weight", 0)
    tied = "output.weight" not in tensors
    rows = next((int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight"), 1)
    weights = sum(tensors.values()) - embedding
    step = weights + (embedding if tied else embedding // max(rows, 1))
    return {"step_bytes": step, "file_weight_bytes": sum(tensors.values()),
            "tied_embeddings": tied}


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    gbs, how = read_bandwidth_gbs(threads)
    print(f"read bandwidth {gbs:.1f} GB/s with {threads} threads ({how})")


if __name__ == "__main__":
    main()
