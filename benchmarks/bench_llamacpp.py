"""Ours vs llama.cpp on the same GGUF file: decode speed, agent hops, concurrent sessions, RSS.

The peer is ``ChatLlamaCpp`` (langchain_community) over llama-cpp-python on the very same
``.gguf`` file, with the same number of threads, greedy, in the same process. Both sides
generate exactly the requested number of tokens (ours ``ignore_eos``; the peer's end-of-text
tokens get a logit bias of -1e9), so the work is the same.

Workloads, for each ``quantization`` mode of ours (``gguf``: the file's own blocks; ``int8``;
``int4``; ``none``: de-quantized float):

* ``decode``: one long reply (``--decode-tokens``, default 256) to a short prompt; tokens/s;
* ``agent``: the 5-hop agent of ``bench_agent.py`` (a ~2,000-token system prompt of tool
  schemas, 32 tokens per hop, a tool result appended after each): ``cold`` is the first task
  in a fresh model (nothing cached on either side), ``warm`` a later task with another question
  (ours finds the system prompt in its prefix cache; llama.cpp keeps the KV of its previous
  prompt and reuses the longest common prefix, which is the system prompt too);
* ``sessions``: ``--sessions`` (16) conversations sharing the system prompt, one 32-token hop
  each: ours one ``abatch`` (continuous batching), the peer serial ``invoke`` calls;
* ``rss``: the peak resident memory of a fresh process that loads the model and runs one
  agent task, for each side in a process of its own (``--skip-rss`` to leave it out).

* ``stream`` (``single_stream.py``): one conversation at any file size, each side in a fresh
  process, run alternately: load to first token, prefill tok/s of a ~1k-token prompt, decode
  tok/s and its fraction of the memory-bandwidth floor measured in the same run
  (``membw.py``), peak RSS.

The file: ``--shape smollm2`` (default) is SmolLM2-135M-Instruct (``--type Q4_1``, as shipped;
another type is re-quantized from it); ``--shape llama-1b|llama-8b`` a random-weight file at
Llama-3.2-1B / Llama-3-8B shape in ``--type Q4_0|Q4_1|Q8_0|Q4_K_M`` (``gguf_shapes.py``
writes it once, cached in ``~/.cache/langchain-ascend-bench``; Q4_K_M needs ``llama-quantize``
from ``../shared/tools/build-llama-tools.sh``); ``--model FILE.gguf`` any file. Workloads
default to ``agent,stream`` on SmolLM2 and ``stream`` on the large shapes (``--workloads``).

Run: ``python benchmarks/bench_llamacpp.py [--shape smollm2|llama-1b|llama-8b] [--type Q4_0]
[--model FILE.gguf] [--workloads agent,stream] [--modes gguf,int8] [--dtype float32|bfloat16]
[--threads 2] [--repeats 2]``. Needs llama-cpp-python
(``../shared/tools/build-llama-cpp-python.sh .venv``); without it the script says so and exits.
Prints one line per measurement, the ratios, and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from bench_agent import run_hops, system_prompt
from langchain_core.messages import HumanMessage, SystemMessage

NEW_TOKENS = 32
QUESTIONS = ("Plan my trip to Beijing next week.",
             "Which flights to Shanghai leave on Friday?",
             "Is it going to rain in Paris on Saturday morning?",
             "Check the inventory of winter jackets in the Osaka store.")


def gguf_path(model: str | None, shape: str = "smollm2", qtype: str | None = None) -> str:
    """``model`` (a .gguf file) where given, else the file of ``shape`` in ``qtype`` (default:
    SmolLM2's own Q4_1, Q4_0 for the random-weight shapes), written first if need be."""
    if model not in (None, "smollm2"):
        return model
    from gguf_shapes import shaped_gguf

    return str(shaped_gguf(shape, qtype or ("Q4_1" if shape == "smollm2" else "Q4_0")))


def build_ours(path: str, mode: str, dtype: str, max_tokens: int, sessions: int):
    from langchain_ascend import AscendChatModel

    ours = AscendChatModel(model=path, quantization=None if mode == "none" else mode,
                           dtype=dtype, device="cpu", temperature=0.0, ignore_eos=True,
                           max_tokens=max_tokens, max_batch_size=max(16, sessions))
    ours.warm_up()
    return ours


def build_peer(path: str, threads: int, max_tokens: int):
    from langchain_community.chat_models import ChatLlamaCpp

    peer = ChatLlamaCpp(model_path=path, n_ctx=8192, n_threads=threads, n_batch=512,
                        temperature=0.0, max_tokens=max_tokens, verbose=False,
                        model_kwargs={"n_threads_batch": threads})
    eos = {peer.client.token_eos()}
    eot = peer.client.tokenize(b"<|im_end|>", add_bos=False, special=True)
    eos |= set(eot) if len(eot) == 1 else set()
    return peer.bind(logit_bias={int(t): -1e9 for t in eos})


def tokens_per_s(chat, prompt: str, num_tokens: int) -> float:
    t = time.perf_counter()
    reply = chat.invoke([HumanMessage(prompt)], max_tokens=num_tokens)
    seconds = time.perf_counter() - t
    produced = (getattr(reply, "usage_metadata", None) or {}).get("output_tokens") or num_tokens
    return produced / seconds


def sessions_s(chat, sessions, *, batched: bool) -> float:
    t = time.perf_counter()
    if batched:
        asyncio.run(chat.abatch(sessions))
    else:
        for s in sessions:
            chat.invoke(s)
    return time.perf_counter() - t


def rss_probe(side: str, path: str, mode: str, dtype: str, threads: int) -> float:
    """Peak RSS (MB) of a fresh process that loads one side and runs one agent task."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r})\n"
        "import bench_llamacpp as b\n"
        "from child_process import peak_rss_mb\n"
        f"b.rss_child({side!r}, {path!r}, {mode!r}, {dtype!r}, {threads})\n"
        "print('PEAK_RSS_MB', peak_rss_mb())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return float(out.rsplit("PEAK_RSS_MB", 1)[1].split()[0])


def rss_child(side: str, path: str, mode: str, dtype: str, threads: int) -> None:
    chat = (build_ours(path, mode, dtype, NEW_TOKENS, 16) if side == "ours"
            else build_peer(path, threads, NEW_TOKENS))
    text = system_prompt(_tokenizer(path))
    run_hops(chat, [SystemMessage(text), HumanMessage(QUESTIONS[0])])


def _tokenizer(path: str):
    """The file's tokenizer, built from its metadata as the engine builds it (the same as
    transformers' GGUF build, tested; transformers' own reads the whole file through
    gguf.GGUFReader: ~15 s of CPU and its arrays in both sides' peak RSS)."""
    from pathlib import Path

    from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer

    return gguf_tokenizer(Path(path))


def main() -> None:
    from gguf_shapes import SHAPE_NAMES, TYPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a .gguf file (overrides --shape/--type)")
    parser.add_argument("--shape", default="smollm2", choices=SHAPE_NAMES)
    parser.add_argument("--type", default=None, choices=TYPES,
                        help="default Q4_1 for smollm2 (its own file), Q4_0 for the others")
    parser.add_argument("--workloads", default=None,
                        help="agent,stream (default: both on smollm2, stream otherwise)")
    parser.add_argument("--modes", default=None,
                        help="ours' quantization modes (default gguf,int8,int4,none on "
                             "smollm2, gguf otherwise)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="stream: prefill prompt")
    parser.add_argument("--repeats", type=int, default=2, help="stream: alternating rounds")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: build it with "
              "../shared/tools/build-llama-cpp-python.sh .venv")
        raise SystemExit(2) from None

    import torch

    torch.set_num_threads(args.threads)
    small = args.model is None and args.shape == "smollm2"
    path = gguf_path(args.model, args.shape, args.type)
    modes = (args.modes or ("gguf,int8,int4,none" if small else "gguf")).split(",")
    workloads = (args.workloads or ("agent,stream" if small else "stream")).split(",")
    result: dict = {"model": os.path.basename(path), "threads": args.threads,
                    "dtype": args.dtype}
    if "stream" in workloads:
        from single_stream import run_stream

        print(f"stream: model {path}; threads {args.threads}; dtype {args.dtype}", flush=True)
        result["stream"] = run_stream(path, modes, args.dtype, args.threads,
                                      prompt_tokens=args.prompt_tokens,
                                      decode_tokens=args.decode_tokens, repeats=args.repeats)
    if "agent" in workloads:
        result.update(agent_workloads(path, modes, args))
    print("RESULT " + json.dumps(result))


def agent_workloads(path: str, modes: list[str], args) -> dict:
    """The decode / agent / sessions / rss workloads, ours in this process (see the doc)."""
    text = system_prompt(_tokenizer(path))
    tasks = [[SystemMessage(text), HumanMessage(q)] for q in QUESTIONS]
    sessions = [[SystemMessage(text), HumanMessage(
        f"Session {i}: traveller {i} asks about flights from city {i} to Beijing on day {i + 1} "
        f"of December with {i % 3 + 1} bags.")] for i in range(args.sessions)]
    print(f"agent: model {path}; threads {args.threads}; dtype {args.dtype}", flush=True)

    peer = build_peer(path, args.threads, NEW_TOKENS)
    peer_cold, _ = run_hops(peer, tasks[0])
    peer_warm, _ = run_hops(peer, tasks[1])
    peer_decode = tokens_per_s(peer, "Tell me a long story about a river town.",
                               args.decode_tokens)
    peer_sessions = sessions_s(peer, sessions, batched=False)
    result: dict = {"peer": {
                        "decode_tok_s": round(peer_decode, 1), "agent_cold_s": round(peer_cold, 2),
                        "agent_warm_s": round(peer_warm, 2),
                        "sessions_s": round(peer_sessions, 2)}, "ours": {}}
    print(f"llama.cpp: decode {peer_decode:.1f} tok/s, agent cold {peer_cold:.2f} s, warm "
          f"{peer_warm:.2f} s, {args.sessions} sessions serial {peer_sessions:.2f} s")
    del peer

    for mode in modes:
        t = time.perf_counter()
        ours = build_ours(path, mode, args.dtype, NEW_TOKENS, args.sessions)
        ready_s = time.perf_counter() - t
        cold, _ = run_hops(ours, tasks[0])
        warm, _ = run_hops(ours, tasks[2])
        decode = tokens_per_s(ours, "Tell me a long story about a river town.",
                              args.decode_tokens)
        batched = sessions_s(ours, sessions, batched=True)
        entry = {"ready_s": round(ready_s, 2), "decode_tok_s": round(decode, 1),
                 "agent_cold_s": round(cold, 2), "agent_warm_s": round(warm, 2),
                 "sessions_s": round(batched, 2),
                 "decode_ratio": round(decode / peer_decode, 2),
                 "agent_cold_ratio": round(peer_cold / cold, 2),
                 "agent_warm_ratio": round(peer_warm / warm, 2),
                 "sessions_ratio": round(peer_sessions / batched, 2)}
        result["ours"][mode] = entry
        print(f"ours {mode}: ready {ready_s:.1f} s; decode {decode:.1f} tok/s "
              f"({entry['decode_ratio']}x); agent cold {cold:.2f} s ({entry['agent_cold_ratio']}x)"
              f", warm {warm:.2f} s ({entry['agent_warm_ratio']}x); sessions {batched:.2f} s "
              f"({entry['sessions_ratio']}x)")
        del ours

    if not args.skip_rss:
        peer_rss = rss_probe("peer", path, "gguf", args.dtype, args.threads)
        result["peer"]["peak_rss_mb"] = round(peer_rss, 1)
        print(f"peak RSS llama.cpp: {peer_rss:.0f} MB")
        for mode in modes:
            rss = rss_probe("ours", path, mode, args.dtype, args.threads)
            result["ours"][mode]["peak_rss_mb"] = round(rss, 1)
            result["ours"][mode]["rss_over_peer_mb"] = round(rss - peer_rss, 1)
            print(f"peak RSS ours {mode}: {rss:.0f} MB ({rss - peer_rss:+.0f} MB vs llama.cpp)")
    return result


if __name__ == "__main__":
    main()
