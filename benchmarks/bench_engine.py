"""Engine-level workloads: LLMEngine vs transformers ``generate``, same weights, same process.

Workloads (greedy, EOS ignored on our side and ``min_new_tokens`` on the peer's, so both
generate exactly the same number of tokens):

* ``agent-hops``: a ~``--system``-token system prompt, ``--hops`` hops; each hop generates
  ``--new`` tokens, then a ~40-token observation is appended and the next hop continues the
  whole history. Ours with prefix caching, ours without, and ``model.generate`` (which
  recomputes the prompt each hop). Reported: seconds for all hops.
* ``concurrent``: ``--sessions`` requests (distinct ~200-token prompts, ``--new`` tokens each)
  submitted at once from threads (continuous batching) vs the same requests one after another
  through ``model.generate``. Reported: aggregate generated tokens/s.

Run: ``python benchmarks/bench_engine.py [--preset bench|tiny] [--dtype float32|bfloat16]``
Prints one line per measurement, the ratios (> 1: we are faster) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import threading
import time


def _peer_generate(model, prompt: list[int], new_tokens: int) -> list[int]:
    import torch

    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


def _observation(tokenizer, hop: int) -> list[int]:
    text = f"\nObservation {hop}: the tool returned status ok with " + "value data " * 12 + "\n"
    return tokenizer.encode(text)


def agent_hops(engine_factory, model, tokenizer, system: list[int], hops: int, new: int) -> dict:
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=new, ignore_eos=True)
    results = {}
    for name, caching in (("ours_cached", True), ("ours_uncached", False)):
        engine = engine_factory(enable_prefix_caching=caching)
        engine.generate(tokenizer.encode("warm up"), SamplingParams(max_tokens=2))
        history = list(system)
        start = time.perf_counter()
        cached = 0
        for hop in range(hops):
            out = engine.generate(history, params)
            cached += out.stats.num_cached_tokens
            history += out.token_ids + _observation(tokenizer, hop)
        results[name] = time.perf_counter() - start
        results[f"{name}_cached_tokens"] = cached
        engine.shutdown()
    history = list(system)
    _peer_generate(model, tokenizer.encode("warm up"), 2)
    start = time.perf_counter()
    for hop in range(hops):
        history += _peer_generate(model, history, new) + _observation(tokenizer, hop)
    results["peer_generate"] = time.perf_counter() - start
    return results


def concurrent(engine_factory, model, tokenizer, sessions: int, new: int) -> dict:
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    prompts = [tokenizer.encode(f"Session {i}: " + "please summarise the report " * 35)
               for i in range(sessions)]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    engine = engine_factory(enable_prefix_caching=False)  # distinct prompts: no reuse anyway
    engine.generate(prompts[0][:8], SamplingParams(max_tokens=2))
    start = time.perf_counter()
    threads = [threading.Thread(target=engine.generate, args=(p, params)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ours = time.perf_counter() - start
    engine.shutdown()
    start = time.perf_counter()
    for p in prompts:
        _peer_generate(model, p, new)
    peer = time.perf_counter() - start
    total = sessions * new
    return {"ours_tok_s": total / ours, "peer_tok_s": total / peer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--arch", default="qwen2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--system", type=int, default=1000, help="system prompt tokens")
    parser.add_argument("--hops", type=int, default=5)
    parser.add_argument("--new", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--sessions", type=int, default=8)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langchain_ascend.engine.llm_engine import LLMEngine
    from langchain_ascend.platform import resolve_device, resolve_dtype
    from langchain_ascend.testing import build_model

    path = build_model(args.preset, args.arch)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    filler = tokenizer.encode("You are an agent. Tools: search, calculator, weather. " * 200)
    system = filler[:args.system]

    def engine_factory(**kwargs):
        return LLMEngine(path, device=str(device), dtype=str(dtype).removeprefix("torch."),
                         num_blocks=kwargs.pop("num_blocks", None), **kwargs)

    print(f"model={args.preset}/{args.arch} device={device} dtype={dtype} "
          f"threads={torch.get_num_threads()}")
    hops = agent_hops(engine_factory, model, tokenizer, system, args.hops, args.new)
    print(f"agent-hops ({args.hops} hops, {args.system}-token system, {args.new} new/hop): "
          f"ours cached {hops['ours_cached']:.2f}s "
          f"(cached prompt tokens {hops['ours_cached_cached_tokens']}), "
          f"ours uncached {hops['ours_uncached']:.2f}s, generate {hops['peer_generate']:.2f}s")
    conc = concurrent(engine_factory, model, tokenizer, args.sessions, args.new)
    print(f"concurrent ({args.sessions} sessions x {args.new} tokens): "
          f"ours {conc['ours_tok_s']:.1f} tok/s, generate sequential {conc['peer_tok_s']:.1f} tok/s")
    ratios = {
        "agent_hops_vs_generate": hops["peer_generate"] / hops["ours_cached"],
        "agent_hops_cache_gain": hops["ours_uncached"] / hops["ours_cached"],
        "concurrent_vs_generate": conc["ours_tok_s"] / conc["peer_tok_s"],
    }
    print("ratios (>1 = ours faster): " + ", ".join(f"{k}={v:.2f}" for k, v in ratios.items()))
    print(json.dumps({"bench": "engine", "preset": args.preset, "device": str(device),
                      "dtype": str(dtype), **hops, **conc, **ratios}))


if __name__ == "__main__":
    main()
