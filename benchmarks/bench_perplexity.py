"""Perplexity of ours vs ``llama-perplexity`` on the same GGUF file and the same text.

The file defaults to SmolLM2-135M-Instruct re-quantized to Q4_K_M by llama.cpp's
``llama-quantize`` (``gguf_shapes.py``: the shipped Q4_1 file de-quantized to F16 by gguf-py,
then quantized; SmolLM2's 576-wide rows are not a multiple of 256, so llama-quantize writes
the tensors it cannot hold as Q4_K/Q6_K in its fallback types, Q5_0 / Q8_0: a file that
exercises the mix the engine meets in the wild). ``--model FILE.gguf`` takes any file.

The text: this repository's README and docs (``performance.md`` left out: the benchmarks edit
it), written to a temporary file without a trailing newline (``llama-perplexity -f`` drops one)
and its sha256 reported. The method is llama-perplexity's own (``tools/perplexity``): the text
tokenized once (a BOS first where the vocabulary says ``add_bos``), cut into ``--chunks``
chunks of ``--ctx`` tokens; each chunk is evaluated from an empty cache with its first token
replaced by BOS where ``add_bos``, and only the second half is scored: the logits at positions
``ctx/2 .. ctx-2`` against the next token, ``ctx/2 - 1`` tokens a chunk; PPL =
exp(mean NLL).

Ours: the file loaded as the engine loads it (``quant.gguf_model.load_gguf_model`` with
``--modes``, default ``gguf``: the blocks the engine runs), its logits over each chunk, with
the keys and values rounded to float16 inside attention as the engine's CPU cache holds them
(``bench_quality.float16_kv``). The tokenization is ours (the file's tokenizer as the engine
builds it); where llama-cpp-python is installed the ids are compared with llama.cpp's own and
the first difference reported, since a different tokenization scores a different sequence.

Run: ``python benchmarks/bench_perplexity.py [--model FILE.gguf] [--ctx 512] [--chunks 8]
[--threads 2] [--modes gguf]``. Needs ``llama-perplexity``
(``../shared/tools/build-llama-tools.sh``). Prints both perplexities, the ratio (bar: within
0.5%) and a final JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path


def chunked(ids: list[int], ctx: int, chunks: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: ``chunks`` consecutive ``ctx``-token pieces, the first
    token of each replaced by ``bos`` (None: kept)."""
    available = len(ids) // ctx
    if available < 2:
        raise ValueError(f"{len(ids)} tokens: llama-perplexity needs at least {2 * ctx}")
    out = []
    for i in range(min(chunks, available)):
        piece = ids[i * ctx:(i + 1) * ctx]
        out.append(([bos] if bos is not None else piece[:1]) + piece[1:])
    return out


def score_second_halves(logits_of, pieces: list[list[int]]) -> tuple[float, int]:
    """Summed NLL and count over the second half of each piece, as llama-perplexity scores:
    logits at positions ``ctx/2 .. ctx-2`` predict tokens ``ctx/2+1 .. ctx-1``."""
    import torch

    nll, count = 0.0, 0
    for piece in pieces:
        first = len(piece) // 2
        logits = logits_of(piece)[first:-1].double()  # (ctx - first - 1, V)
        target = torch.tensor(piece[first + 1:])  # (ctx - first - 1,)
        logp = torch.log_softmax(logits, dim=-1)
        nll -= float(logp.gather(1, target[:, None]).sum())
        count += len(piece) - first - 1
    return nll, count


def ours_perplexity(path: str, mode: str, pieces: list[list[int]]) -> dict:
    import torch
    from bench_quality import float16_kv

    from langchain_ascend.quant.gguf_model import load_gguf_model

    t = time.perf_counter()
    model, report = load_gguf_model(path, quantization=mode)
    model.set_attn_implementation("sdpa")  # the op float16_kv wraps
    load_s = time.perf_counter() - t

    def logits_of(piece: list[int]):
        return model(input_ids=torch.tensor([piece])).logits[0].float()  # (ctx, V)

    t = time.perf_counter()
    with torch.inference_mode(), float16_kv():
        nll, count = score_second_halves(logits_of, pieces)
    return {"perplexity": round(math.exp(nll / count), 4), "scored_tokens": count,
            "weight_format": report.weight_format, "load_s": round(load_s, 2),
            "score_s": round(time.perf_counter() - t, 2)}


def peer_perplexity(path: str, text_file: str, ctx: int, chunks: int, threads: int) -> dict:
    from gguf_shapes import llama_tool

    cmd = [str(llama_tool("llama-perplexity")), "-m", path, "-f", text_file, "-c", str(ctx),
           "-b", str(ctx), "--chunks", str(chunks), "-t", str(threads), "-tb", str(threads)]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    log = done.stdout + done.stderr
    found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"llama-perplexity failed ({done.returncode}):\n{log[-3000:]}")
    tokens = re.search(r"tokenization took .*\n", log)
    return {"perplexity": float(found.group(1)), "stderr": float(found.group(2)),
            "seconds": round(time.perf_counter() - t, 2),
            "command": " ".join(cmd[1:]), "log_tokenization": tokens.group(0).strip()
            if tokens else None}


def llama_cpp_ids(path: str, text: str, add_bos: bool) -> list[int] | None:
    """llama.cpp's tokenization of ``text`` (llama-cpp-python, vocabulary only), or None."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    vocab = Llama(model_path=path, vocab_only=True, verbose=False)
    return list(vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a .gguf file (default: SmolLM2 Q4_K_M)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--modes", default="gguf")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import gguf
    import torch
    from bench_corpus import docs_text
    from gguf_shapes import shaped_gguf

    from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer

    torch.set_num_threads(args.threads)
    path = args.model or str(shaped_gguf("smollm2", "Q4_K_M"))
    text = docs_text(skip=("performance.md",)).rstrip("\n")
    fields = gguf.GGUFReader(path).fields
    add_bos = bool(fields["tokenizer.ggml.add_bos_token"].contents()) \
        if "tokenizer.ggml.add_bos_token" in fields else False
    bos = int(fields["tokenizer.ggml.bos_token_id"].contents()) if add_bos else None
    tokenizer = gguf_tokenizer(Path(path))
    ids = ([bos] if add_bos else []) + list(tokenizer(text, add_special_tokens=False)["input_ids"])
    pieces = chunked(ids, args.ctx, args.chunks, bos)
    result: dict = {"model": os.path.basename(path), "ctx": args.ctx, "chunks": len(pieces),
                    "text_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                    "text_tokens": len(ids), "add_bos": add_bos, "threads": args.threads}
    theirs = llama_cpp_ids(path, text, add_bos)
    if theirs is not None:
        span = len(pieces) * args.ctx
        same = theirs[:span] == ids[:span]
        result["same_tokens_as_llama_cpp"] = same
        if not same:
            result["first_token_difference"] = next(
                i for i, (a, b) in enumerate(zip(theirs, ids, strict=False)) if a != b)
    print(f"model {path}\n{len(ids)} tokens of text; {len(pieces)} chunks of {args.ctx}; "
          f"tokens as llama.cpp's: {result.get('same_tokens_as_llama_cpp', 'not checked')}",
          flush=True)

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        peer = peer_perplexity(path, f.name, args.ctx, len(pieces), args.threads)
    finally:
        os.unlink(f.name)
    result["llama_cpp"] = peer
    print(f"llama-perplexity: PPL {peer['perplexity']:.4f} +/- {peer['stderr']:.4f}", flush=True)
    result["ours"] = {}
    for mode in args.modes.split(","):
        ours = ours_perplexity(path, mode, pieces)
        ours["vs_llama_cpp"] = round(ours["perplexity"] / peer["perplexity"], 4)
        result["ours"][mode] = ours
        print(f"ours {mode}: PPL {ours['perplexity']:.4f} ({ours['weight_format']}); "
              f"ours / llama.cpp {ours['vs_llama_cpp']:.4f}", flush=True)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
