"""What each weight format costs in quality: perplexity and agreement with the float model.

Workload: the English prose the package ships (``langchain_ascend/testing/data/prose_en.txt``),
tokenized once by the model's tokenizer and cut into windows of ``--window`` tokens; every
token after the first of a window is scored. For each ``quantization`` mode we load the model
as the engine does (``"none"``: every weight de-quantized to float; ``"gguf"``: the file's own
blocks; ``"int8"`` / ``"int4"``: every linear quantized to ``q8_0`` / ``q4_1`` at load) and
report its perplexity, the ratio to the float model's, and the top-1 agreement with the float
model over the same positions (teacher-forced: the share of positions whose argmax equals the
float model's).

The peer, llama.cpp on the same GGUF file (llama-cpp-python, when installed), scores the very
same token ids with the same windows: for ``"gguf"`` both multiply the same blocks, so the
perplexities should agree within rounding (the bar is 0.5%).

The KV cache: the engine stores keys and values in float16 under quantized weights on the CPU
(``kv_cache_dtype="auto"``), and a prompt attends those rounded values. Each quantized mode is
scored both ways: ``perplexity`` with the engine's float16 keys and values (post-rotary keys
and values rounded to float16 inside attention, as the engine rounds them), and
``perplexity_float32_kv`` without. llama.cpp's own cache is float16 too.

Run: ``python benchmarks/bench_quality.py [--model smollm2|FILE.gguf] [--window 512]``
Prints a table, the ratios, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

MODES = ("none", "gguf", "int8", "int4")


def prose_ids(tokenizer) -> list[int]:
    from langchain_ascend.testing.corpus import bundled_prose

    return list(tokenizer(bundled_prose(), add_special_tokens=False)["input_ids"])


def windows(ids: list[int], size: int) -> list[list[int]]:
    """Non-overlapping windows of ``size`` tokens (a shorter last one kept if >= 16)."""
    cut = [ids[i:i + size] for i in range(0, len(ids), size)]
    return [w for w in cut if len(w) >= 16]


def score_ours(model, chunks: list[list[int]]):
    """Summed negative log-likelihood, count and the argmax at every scored position."""
    import torch

    nll, count, argmax = 0.0, 0, []
    with torch.inference_mode():
        for chunk in chunks:
            ids = torch.tensor([chunk])  # (1, T)
            logits = model(input_ids=ids).logits[0, :-1].float()  # (T-1, V)
            logp = torch.log_softmax(logits, dim=-1)  # (T-1, V)
            target = ids[0, 1:]  # (T-1,)
            nll -= float(logp.gather(1, target[:, None]).sum())
            count += len(chunk) - 1
            argmax.append(logits.argmax(dim=-1))
    return nll, count, torch.cat(argmax)


class float16_kv:  # noqa: N801 - a context manager, named for what it stands for
    """Attention over keys and values rounded to float16, as the engine's float16 KV cache
    holds them (``torch.nn.functional.scaled_dot_product_attention`` wrapped meanwhile)."""

    def __enter__(self):
        import torch

        self.inner = torch.nn.functional.scaled_dot_product_attention

        def rounded(query, key, value, *args, **kwargs):
            key, value = (x.to(torch.float16).to(x.dtype) for x in (key, value))
            return self.inner(query, key, value, *args, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = rounded
        return self

    def __exit__(self, *exc):
        import torch

        torch.nn.functional.scaled_dot_product_attention = self.inner


def score_llama_cpp(path: str, chunks: list[list[int]], window: int, threads: int):
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=window, n_batch=window, n_threads=threads,
                logits_all=True, verbose=False)
    nll, count = 0.0, 0
    for chunk in chunks:
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[: len(chunk) - 1], dtype=np.float64)  # (T-1, V)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].sum())
        count += len(chunk) - 1
    return nll, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a .gguf file")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from langchain_ascend.engine.model_source import resolve_model_source
    from langchain_ascend.quant.gguf_model import load_gguf_model

    path = args.model
    if path == "smollm2":
        from langchain_ascend.testing import smollm2_gguf_path

        path = str(smollm2_gguf_path())
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_source(path).path))
    chunks = windows(prose_ids(tokenizer), args.window)
    print(f"model {path}\n{sum(len(c) for c in chunks)} tokens in {len(chunks)} windows of "
          f"{args.window}; threads {args.threads}")

    result: dict = {"model": os.path.basename(path), "window": args.window, "modes": {}}
    float_argmax = None
    float_ppl = None
    for mode in args.modes.split(","):
        t = time.perf_counter()
        model, report = load_gguf_model(path, quantization=mode)
        model.set_attn_implementation("sdpa")  # the wrapped op below is the one it calls
        load_s = time.perf_counter() - t
        nll, count, argmax = score_ours(model, chunks)
        ppl = math.exp(nll / count)
        float32_kv_ppl = None
        if mode != "none":  # the engine's float16 cache of quantized weights
            float32_kv_ppl = ppl
            with float16_kv():
                nll, count, argmax = score_ours(model, chunks)
            ppl = math.exp(nll / count)
        if mode == "none":
            float_argmax, float_ppl = argmax, ppl
        entry = {"perplexity": round(ppl, 4), "weight_format": report.weight_format,
                 "weight_mb": round(report.weight_bytes / 1e6, 1), "load_s": round(load_s, 2)}
        if float32_kv_ppl is not None:
            entry["perplexity_float32_kv"] = round(float32_kv_ppl, 4)
        if float_ppl is not None and mode != "none":
            entry["ppl_vs_float"] = round(ppl / float_ppl, 4)
            entry["top1_agreement_with_float"] = round(
                float((argmax == float_argmax).float().mean()), 4)
        result["modes"][mode] = entry
        print(f"ours {mode:5s}: perplexity {ppl:.4f}  ({entry})")
        del model

    try:
        nll, count = score_llama_cpp(path, chunks, args.window, args.threads)
    except ImportError:
        print("llama.cpp peer skipped: llama-cpp-python is not installed "
              "(../shared/tools/build-llama-cpp-python.sh .venv)")
    else:
        peer_ppl = math.exp(nll / count)
        result["llama_cpp_perplexity"] = round(peer_ppl, 4)
        print(f"llama.cpp on the same file: perplexity {peer_ppl:.4f}")
        if "gguf" in result["modes"]:
            ours = result["modes"]["gguf"]["perplexity"]
            result["gguf_vs_llama_cpp"] = round(ours / peer_ppl, 4)
            print(f"ours gguf / llama.cpp perplexity: {ours / peer_ppl:.4f}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
