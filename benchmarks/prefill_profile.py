"""Where one prefill's time goes: every native call of an engine's prefill step, timed.

``perf`` is not available on the benchmark VMs and torch's profiler does not see the engine's
step thread, so this wraps the native entry points a CPU prefill calls -- the quantized
products (``native.qmatmul.qmatmul``, by weight shape and rows), the attention
(``native.paged_attention.paged_decode``: every prefill token as the one-row decode at its
position), RoPE and the cache write, the RMSNorms and the
MLP's SiLU -- for the duration of the measured prefills, and reports each one's wall time and
its calling thread's CPU time (the product kernels run on that thread and one more; on a shared
machine the CPU time is what the work cost, the wall time what it took). What is left of the
prefill's wall time is everything else: Python, torch's small ops, the embedding, the head.

Run: ``python benchmarks/prefill_profile.py [--model FILE.gguf | --shape llama-1b --type Q4_0]
[--tokens 1024] [--threads 2]``: one short warm-up prompt, then two prompts of ``--tokens``
sharing no prefix (the same ids as ``single_stream.py``), a table for each, and a JSON line.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class CallTimes:
    """Wall and calling-thread CPU seconds and call counts per label."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def timed(self, fn: Callable[..., Any], label: Callable[..., str]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            out = fn(*args, **kwargs)
            key = label(*args, **kwargs)
            self.wall[key] += time.perf_counter() - wall
            self.cpu[key] += time.thread_time() - cpu
            self.calls[key] += 1
            return out
        return wrapper


@contextlib.contextmanager
def timing(times: CallTimes) -> Iterator[None]:
    """Wrap the native entry points of a CPU prefill for the duration (restored after)."""
    from langchain_ascend.native import paged_attention, qmatmul, rms_norm, rope_kv, stack_kernel
    from langchain_ascend.quant import linear

    def product(x: Any, qw: Any, *_: Any, **__: Any) -> str:
        return f"qmatmul {qw.fmt} {qw.layout} {qw.out_features}x{qw.in_features} M={x.shape[0]}"

    patches = [(qmatmul, "qmatmul", product),
               (paged_attention, "paged_decode", lambda *a, **k: "attention"),
               (rope_kv, "rope_and_write", lambda *a, **k: "rope + cache write"),
               (rms_norm, "rms_norm", lambda *a, **k: "rms_norm"),
               (stack_kernel, "silu_mul", lambda *a, **k: "silu * up")]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    native_before = linear._native_qmatmul()  # the function QuantizedLinear looked up once
    try:
        for module, name, label in patches:
            setattr(module, name, times.timed(getattr(module, name), label))
        if native_before is not None:
            linear._NATIVE = qmatmul.qmatmul
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        if native_before is not None:
            linear._NATIVE = native_before


def main() -> None:
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--shape", default="llama-1b")
    parser.add_argument("--type", default=None)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import single_stream
    from bench_llamacpp import gguf_path

    from langchain_ascend import AscendChatModel
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    path = gguf_path(args.model, args.shape, args.type)
    ids = single_stream.prompt_ids(path, args.tokens)
    chat = AscendChatModel(model=path, device="cpu", dtype="float32", temperature=0.0,
                           max_context_length=single_stream.N_CTX, quantization="gguf")
    engine = chat.get_engine()
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def first_token(prompt: list[int]) -> None:
        for delta in engine.stream(prompt, params):
            if delta.token_ids:
                return

    first_token(ids["load"])
    runs = []
    for prompt in ids["prefill"]:
        times = CallTimes()
        load = os.getloadavg()[0]
        with timing(times):
            start = time.perf_counter()
            first_token(prompt)
            total = time.perf_counter() - start
        native = sum(times.wall.values())
        print(f"\nprefill of {len(prompt)} tokens: {total:.3f} s, {len(prompt) / total:.1f} tok/s "
              f"(load average {load:.2f})")
        for key in sorted(times.wall, key=times.wall.get, reverse=True):
            print(f"  {times.wall[key] * 1e3:9.1f} ms {100 * times.wall[key] / total:5.1f}%   "
                  f"thread CPU {times.cpu[key] * 1e3:9.1f} ms   x{times.calls[key]:<4d} {key}")
        print(f"  {(total - native) * 1e3:9.1f} ms {100 * (total - native) / total:5.1f}%   "
              "everything else (Python, torch ops, embedding, head)")
        runs.append({"tokens": len(prompt), "seconds": round(total, 4), "loadavg_1m": load,
                     "calls": {k: {"wall_ms": round(v * 1e3, 2),
                                   "thread_cpu_ms": round(times.cpu[k] * 1e3, 2),
                                   "calls": times.calls[k]} for k, v in times.wall.items()}})
    engine.shutdown()
    print("RESULT " + json.dumps({"model": os.path.basename(path), "threads": args.threads,
                                  "runs": runs}))


if __name__ == "__main__":
    main()
