"""The int8 compute limit of this machine: how many int8 multiply-adds per second ``dpbusd``
(AVX512-VNNI 512-bit, AVX-VNNI 256-bit) or AVX2 ``maddubs`` + ``madd`` can do, per core and
with N threads -- the ceiling a quantized prefill's products are reported against.

A tiny C loop (``cc -O3``, each variant under its own target attribute, never
``-march=native``, which may emit AMX on VMs that trap it; compiled once and cached beside
the benchmark GGUF files) runs 12 independent accumulator chains of the instruction (enough
to cover its latency on every current core) for a fixed count; a MAC is one u8 x s8 product
summed (``vpdpbusd zmm`` = 64, ``ymm`` = 32; AVX2's pair ``vpmaddubsw`` + ``vpmaddwd`` = 32).
Where the CPU lacks a variant its line is left out. Run:
``python benchmarks/int8_peak.py [--threads 2]``; prints GMAC/s per variant (best of 5) and a
JSON line. Wall clock: on a shared machine run it when quiet, or read the 1-thread line.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
import time

_C_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
#include <time.h>

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#define CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

__attribute__((target("avx512f,avx512vnni"))) static int64_t loop512(int64_t n, int32_t seed) {
    const __m512i u = _mm512_set1_epi32(seed | 0x01010101), s = _mm512_set1_epi32(seed ^ 0x7f);
#define Z_DECL(k) __m512i a##k = _mm512_set1_epi32(k);
#define Z_STEP(k) a##k = _mm512_dpbusd_epi32(a##k, u, s);
#define Z_SUM(k) t = _mm512_add_epi32(t, a##k);
    CHAINS(Z_DECL)
    for (int64_t i = 0; i < n; i++) { CHAINS(Z_STEP) __asm__ volatile("" ::: "memory"); }
    __m512i t = _mm512_setzero_si512();
    CHAINS(Z_SUM)
    return _mm512_reduce_add_epi32(t);
}

__attribute__((target("avx2,avxvnni"))) static int64_t loop256(int64_t n, int32_t seed) {
    const __m256i u = _mm256_set1_epi32(seed | 0x01010101), s = _mm256_set1_epi32(seed ^ 0x7f);
#define Y_DECL(k) __m256i a##k = _mm256_set1_epi32(k);
#define Y_STEP(k) a##k = _mm256_dpbusd_avx_epi32(a##k, u, s);
#define Y_SUM(k) t = _mm256_add_epi32(t, a##k);
    CHAINS(Y_DECL)
    for (int64_t i = 0; i < n; i++) { CHAINS(Y_STEP) __asm__ volatile("" ::: "memory"); }
    __m256i t = _mm256_setzero_si256();
    CHAINS(Y_SUM)
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, t);
    return out[0] + out[7];
}

__attribute__((target("avx2"))) static int64_t loop_avx2(int64_t n, int32_t seed) {
    __m256i u = _mm256_set1_epi32(seed | 0x01010101);
    const __m256i s = _mm256_set1_epi32(seed ^ 0x7f), ones = _mm256_set1_epi16(1);
    /* the asm makes u look changed each iteration, so the products are not hoisted */
#define A_STEP(k) a##k = _mm256_add_epi32(a##k, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
    CHAINS(Y_DECL)
    for (int64_t i = 0; i < n; i++) { CHAINS(A_STEP) __asm__ volatile("" : "+x"(u)); }
    __m256i t = _mm256_setzero_si256();
    CHAINS(Y_SUM)
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, t);
    return out[0] + out[7];
}

/* Wall seconds for `threads` threads each running n iterations of 12 chains of variant v
   (0 AVX2 pair, 1 AVX-VNNI ymm, 2 AVX512-VNNI zmm); *cpu gets the largest thread CPU time
   (what one core took while it ran: other processes' share of the cores left out). */
double int8_peak_run(int v, int64_t n, int threads, int64_t *sink, double *cpu) {
    double t0 = omp_get_wtime(), worst = 0.0;
    int64_t total = 0;
    #pragma omp parallel num_threads(threads) reduction(+:total) reduction(max:worst)
    {
        int32_t seed = omp_get_thread_num() + (int32_t)(*sink & 0xff);
        double c0 = thread_seconds();
        total += v == 2 ? loop512(n, seed) : v == 1 ? loop256(n, seed) : loop_avx2(n, seed);
        worst = thread_seconds() - c0;
    }
    *sink += total;
    *cpu = worst;
    return omp_get_wtime() - t0;
}
"""
VARIANTS = (("avx2 maddubs+madd", 32, {"avx2"}), ("avx-vnni dpbusd ymm", 32, {"avx_vnni"}),
            ("avx512-vnni dpbusd zmm", 64, {"avx512_vnni", "avx512f"}))
"""(name, MACs per instruction per chain step, the /proc/cpuinfo flags it needs), by code."""
CHAIN_COUNT = 12


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _library() -> ctypes.CDLL | None:
    from gguf_shapes import cache_dir

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(_C_SOURCE.encode()).hexdigest()[:12]
    lib = cache_dir() / f"int8peak-{digest}.so"
    if not lib.exists():
        src = lib.with_suffix(".c")
        src.write_text(_C_SOURCE)
        built = subprocess.run([compiler, "-O3", "-fopenmp", "-shared", "-fPIC", str(src), "-o",
                                str(lib)], capture_output=True, text=True)
        if built.returncode != 0:
            print(built.stderr, file=sys.stderr)
            return None
    so = ctypes.CDLL(str(lib))
    so.int8_peak_run.restype = ctypes.c_double
    so.int8_peak_run.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)]
    return so


def peak_gmacs(threads: int, *, iterations: int = 20_000_000,
               passes: int = 5) -> dict[str, dict[str, float]]:
    """Per variant the CPU has: ``wall`` the best GMAC/s (1e9 int8 multiply-adds a second) of
    all threads together by the wall clock, ``per_core_cpu`` one thread's by its own CPU time
    (robust to other processes sharing the cores; times ``threads`` is the machine's limit
    when the cores are not shared)."""
    so = _library()
    if so is None:
        return {}
    flags, sink, out = _cpu_flags(), ctypes.c_int64(0), {}
    for code, (name, macs, needs) in enumerate(VARIANTS):
        if not needs <= flags:
            continue
        walls, cpus = [], []
        for _ in range(passes):
            cpu = ctypes.c_double(0.0)
            walls.append(so.int8_peak_run(code, iterations, threads, ctypes.byref(sink),
                                          ctypes.byref(cpu)))
            cpus.append(cpu.value)
        work = iterations * CHAIN_COUNT * macs
        out[name] = {"wall": work * threads / min(walls) / 1e9,
                     "per_core_cpu": work / min(cpus) / 1e9}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    result = {}
    for threads in args.threads:
        t = time.perf_counter()
        peaks = peak_gmacs(threads)
        for name, rates in peaks.items():
            print(f"{threads} thread(s): {name}: {rates['wall']:.1f} GMAC/s wall, "
                  f"{rates['per_core_cpu']:.1f} GMAC/s per core by CPU time")
        result[str(threads)] = {k: {kk: round(vv, 1) for kk, vv in v.items()}
                                for k, v in peaks.items()}
        print(f"  ({time.perf_counter() - t:.1f} s)")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
