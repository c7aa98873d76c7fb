"""Decode step time: our ModelRunner vs transformers ``generate``, same model, same process.

For each batch size, B requests with a ``--context``-token prompt are prefilled, then
``--steps`` decode steps are timed (ms per step; every step yields one token per request).
The transformers side is ``model.generate`` on the same weights (sdpa attention, its
DynamicCache), greedy; its per-step time comes from timestamps taken at every generated token
(a stopping criterion that never stops), so prefill is excluded on both sides.

Usage:
    python benchmarks/bench_decode.py [--dtype float32|bfloat16] [--batch-sizes 1 4 16]
        [--context 256] [--steps 32] [--rounds 3] [--threads N] [--preset bench]
        [--device cpu|cuda|npu] [--compile]

Prints a table, the ratios (HF ms / ours ms: > 1 means we are faster) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time


def _ours_ms_per_step(runner, prompts: list[list[int]], steps: int, rounds: int) -> float:
    from langchain_ascend.engine.core.batch import ScheduledBatch, ScheduledSegment
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    block_size = runner.block_size
    context = len(prompts[0])
    steps_total = steps * rounds + 2
    params = SamplingParams(max_tokens=steps_total, ignore_eos=True)
    blocks_per_req = -(-(context + steps_total + 1) // block_size)
    tables = [list(range(r * blocks_per_req, (r + 1) * blocks_per_req)) for r in range(len(prompts))]
    prefill = [ScheduledSegment(f"r{r}", p, 0, tables[r], True, params) for r, p in enumerate(prompts)]
    last = runner.execute(ScheduledBatch(segments=prefill))
    pos = context

    def decode_step() -> None:
        nonlocal last, pos
        segs = [ScheduledSegment(f"r{r}", [last[r]], pos, tables[r], True, params)
                for r in range(len(prompts))]
        last = runner.execute(ScheduledBatch(segments=segs))
        pos += 1

    decode_step()  # first decode outside the timing
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            decode_step()
        best = min(best, time.perf_counter() - start)
    runner.release([f"r{r}" for r in range(len(prompts))])
    return best / steps * 1000


def _hf_ms_per_step(model, prompts: list[list[int]], steps: int, rounds: int) -> float:
    """Per-token time of ``model.generate``, from timestamps taken at every generated token."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    ids = torch.tensor(prompts, device=model.device)
    best = float("inf")
    for _ in range(rounds):
        clock = StepClock()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       max_new_tokens=steps + 2, min_new_tokens=steps + 2, do_sample=False,
                       pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
        stamps = clock.stamps[1:]  # from the first decode step on (prefill excluded)
        best = min(best, (stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--arch", default="qwen2")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating timed repetitions of ours and HF; the fastest of each "
                             "is reported (for noisy shared hosts)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, npu (both sides)")
    parser.add_argument("--compile", action="store_true",
                        help="compile our decode step (see langchain_ascend.engine.worker.compile)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from langchain_ascend.engine.worker.model_runner import ModelRunner
    from langchain_ascend.platform import resolve_device, resolve_dtype
    from langchain_ascend.testing import build_model

    path = build_model(args.preset, args.arch)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    max_batch = max(args.batch_sizes)
    num_blocks = max_batch * (-(-(args.context + args.steps * args.rounds + 8) // 16)) + 4
    runner = ModelRunner.load(str(path), device=str(device), dtype=dtype,
                              num_blocks=num_blocks, block_size=16, compile=args.compile)
    runner.warmup()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    rows = []
    with torch.inference_mode():
        for batch in args.batch_sizes:
            prompts = torch.randint(0, vocab, (batch, args.context), generator=gen).tolist()
            ours = theirs = float("inf")
            for _ in range(args.rounds):  # alternate, so load from other processes hits both
                ours = min(ours, _ours_ms_per_step(runner, prompts, args.steps, 1))
                theirs = min(theirs, _hf_ms_per_step(hf, prompts, args.steps, 1))
            rows.append({"batch": batch, "ours_ms": round(ours, 2), "hf_ms": round(theirs, 2),
                         "speedup": round(theirs / ours, 2),
                         "ours_tok_s": round(batch * 1000 / ours, 1)})
    print(f"decode ms/step, {args.preset}/{args.arch} {args.dtype} on {device}, context "
          f"{args.context}, {torch.get_num_threads()} threads, compile {args.compile}")
    print(f"{'batch':>5} {'ours':>9} {'hf':>9} {'hf/ours':>8} {'ours tok/s':>11}")
    for row in rows:
        print(f"{row['batch']:>5} {row['ours_ms']:>9.2f} {row['hf_ms']:>9.2f} "
              f"{row['speedup']:>8.2f} {row['ours_tok_s']:>11.1f}")
    print(json.dumps({"benchmark": "decode", "preset": args.preset, "arch": args.arch,
                      "dtype": args.dtype, "device": str(device), "compile": args.compile,
                      "context": args.context,
                      "threads": torch.get_num_threads(), "results": rows}))


if __name__ == "__main__":
    main()
