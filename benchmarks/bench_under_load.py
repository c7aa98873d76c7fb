"""One stream while other work keeps the cores busy: ours (libgomp's default spin and a short
one) and llama.cpp, on the same GGUF file.

An agent's tools, a second process or a browser share a laptop's cores with the model. GNU
OpenMP (torch, our native kernels and llama.cpp all use it) spins at every barrier for up to
300,000 pause loops before sleeping (``GOMP_SPINCOUNT``, when ``OMP_WAIT_POLICY`` is unset).
Each configuration runs the ``single_stream`` child (load, a ``--prompt-tokens`` prefill,
``--decode-tokens`` greedy tokens) in a fresh process, first with nothing else started, then
beside ``--busy`` Python processes that spin on the CPU (a CPU-bound tool each):

* ``ours``: our defaults (libgomp's spin);
* ``ours GOMP_SPINCOUNT=1000``: a short spin (~20 us), which helps where the other load is
  itself OpenMP threads spinning (several engines on one machine) and hurts beside plain
  CPU-bound processes (``docs/performance.md``);
* ``llama.cpp``: llama-cpp-python, its defaults (skipped when not installed).

Run: ``python benchmarks/bench_under_load.py [--model FILE.gguf] [--busy 2]``; prints one
line per run, the slowdown each side takes under load, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from single_stream import prompt_ids, run_child  # noqa: E402

CONFIGS = {"ours": ("ours", {}), "ours GOMP_SPINCOUNT=1000": ("ours", {"GOMP_SPINCOUNT": "1000"}),
           "llama.cpp": ("peer", {})}


def _spin_forever() -> None:
    while True:
        pass


@contextmanager
def busy_cores(count: int):
    """``count`` processes that keep a core busy each until the block ends."""
    workers = [multiprocessing.Process(target=_spin_forever, daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a .gguf file (default: SmolLM2's)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes under load")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.model is None:
        from langchain_ascend.testing.real_model import smollm2_gguf_path

        args.model = str(smollm2_gguf_path())
    configs = dict(CONFIGS)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: llama.cpp side skipped")
        configs.pop("llama.cpp")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompt_ids(args.model, args.prompt_tokens), f)
        ids_file = f.name
    results: dict[str, dict[str, dict]] = {"idle": {}, "busy": {}}
    try:
        for phase in ("idle", "busy"):
            with busy_cores(args.busy if phase == "busy" else 0):
                for name, (side, env) in configs.items():
                    got = run_child(side, args.model, "gguf", "float32", args.threads,
                                    ids_file, args.decode_tokens, extra_env=env)
                    results[phase][name] = got
                    print(f"{phase:4s} {name:24s} prefill {got['prefill_tok_s']:8.1f} tok/s  "
                          f"decode {got['decode_tok_s']:7.2f} tok/s  load {got['load_s']:.2f} s"
                          f"  (load average {got['loadavg_1m']})", flush=True)
    finally:
        os.unlink(ids_file)
    summary = {}
    for name in configs:
        idle, busy = results["idle"][name], results["busy"][name]
        summary[name] = {"prefill_slowdown": round(idle["prefill_tok_s"] / busy["prefill_tok_s"], 2),
                         "decode_slowdown": round(idle["decode_tok_s"] / busy["decode_tok_s"], 2)}
        print(f"{name:24s} under load: prefill {summary[name]['prefill_slowdown']}x slower, "
              f"decode {summary[name]['decode_slowdown']}x slower")
    print(json.dumps({"busy": args.busy, "threads": args.threads, "model": args.model,
                      "summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
