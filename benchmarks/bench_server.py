"""``langchain-ascend serve`` vs llama-cpp-python's OpenAI server: concurrent streaming clients.

Both servers run as subprocesses on 127.0.0.1 (free ports), one after the other, on the same
GGUF file with the same number of threads (ours: ``OMP_NUM_THREADS`` / torch's threads; the
peer: ``--n_threads`` and ``--n_threads_batch``). Each is driven by the official ``openai``
async client: for every level of ``--clients`` (default 1, 16, 100), that many clients run at
once, each sending ``--requests-per-client`` streamed chat completions one after another.

The prompts are an agent's: one shared system prompt of ~``--system-tokens`` tokens (tool
schemas, as in ``bench_agent.py``) and a distinct user tail per request. Greedy
(``temperature=0``), ``--max-tokens`` (64) tokens per reply on both sides: ours gets vLLM's
``ignore_eos``, the peer a logit bias of -1e9 on its end-of-text tokens (as
``bench_llamacpp.py`` does), so both do the same work. Before the levels each side answers
one request (loading, and the system prompt in its cache: ours keeps it in the prefix cache,
llama.cpp keeps the KV of its last prompt and reuses the longest common prefix).

The peer runs with ``--interrupt_requests False``: by default a new request interrupts the
stream in flight, which would cut every concurrent reply short. It serves one request at a
time; ours batches every request in flight on one engine.

Per level and side: TTFT (request sent -> first content token) p50 / p99, latency (request
sent -> last chunk) p50 / p99, output tokens/s (all tokens of the level / its wall time),
failures (exceptions, HTTP errors) and short replies (fewer tokens than asked); ours also
the mean prompt tokens served from its prefix cache (``cached_prompt_tokens``). Ratios:
tokens/s ours / peer; p99 TTFT and p99 latency peer / ours.

Run: ``python benchmarks/bench_server.py [--model smollm2|FILE.gguf|HF_FOLDER] [--threads 2]
[--clients 1,16,100] [--requests-per-client 1] [--max-tokens 64]``. An HF folder runs ours
only (the peer needs a GGUF). Needs the ``serve`` and ``bench`` extras and llama-cpp-python
(``../shared/tools/build-llama-cpp-python.sh .venv``). Prints one line per level and side,
the ratios, and a final ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_agent import system_prompt

from langchain_ascend.testing.server_process import free_port, serve_command, server_process

SERVED_NAME = "bench-model"
TOPICS = ("flights to Beijing", "the weather in Paris", "winter jackets in the Osaka store",
          "a hotel in Shanghai", "trains from Berlin to Prague", "the meeting room calendar")


@dataclass
class Sample:
    """One streamed request: seconds to the first content token and to the end, tokens."""

    ttft: float = math.nan
    latency: float = math.nan
    tokens: int = 0
    cached: int | None = None
    error: str | None = None


@dataclass
class Side:
    """How to start one server and what its requests carry beyond the common fields."""

    name: str
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    extra_body: dict = field(default_factory=dict)


def model_path(model: str) -> str:
    if model == "smollm2":
        from langchain_ascend.testing import smollm2_gguf_path

        return str(smollm2_gguf_path())
    return model


def load_tokenizer(path: str):
    """The model's tokenizer; for a GGUF file, built from its metadata as the engine builds it
    (transformers' own GGUF path reads the whole file: ~15 s of CPU before the first request)."""
    p = Path(path)
    if p.suffix == ".gguf":
        from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer

        return gguf_tokenizer(p)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def end_token_ids(tokenizer) -> list[int]:
    """The ids that end a reply: EOS and the chat template's end-of-turn tokens."""
    ids = {tokenizer.eos_token_id}
    for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token, int) and token != tokenizer.unk_token_id:
            ids.add(token)
    return sorted(i for i in ids if i is not None)


def user_tail(client: int, request: int) -> str:
    topic = TOPICS[(client + request) % len(TOPICS)]
    return (f"Client {client}, request {request}: traveller {client} needs help with {topic} "
            f"on day {request + 1} of December. Plan the next step and explain it in detail.")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return math.nan
    return data[min(len(data) - 1, max(0, math.ceil(q / 100 * len(data)) - 1))]


async def one_request(client, system: str, tail: str, max_tokens: int,
                      extra_body: dict) -> Sample:
    """Stream one chat completion; time its first content token and its end."""
    sample = Sample()
    started = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=SERVED_NAME, stream=True, temperature=0, max_tokens=max_tokens,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": tail}],
            extra_body=extra_body)
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if sample.tokens == 0:
                    sample.ttft = time.perf_counter() - started
                sample.tokens += 1  # one chunk per token, unless a usage chunk says better
            usage = chunk.usage or usage
        sample.latency = time.perf_counter() - started
        if usage is not None:
            sample.tokens = usage.completion_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            sample.cached = getattr(details, "cached_tokens", None)
    except Exception as error:  # counted as a failure, the level goes on
        sample.error = f"{type(error).__name__}: {error}"[:300]
    return sample


async def run_level(url: str, side: Side, system: str, clients: int, per_client: int,
                    max_tokens: int) -> tuple[list[Sample], float]:
    """``clients`` concurrent clients, ``per_client`` requests each; samples, wall seconds."""
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0,
                           timeout=httpx.Timeout(3600.0),
                           http_client=httpx.AsyncClient(limits=limits)) as client:

        async def client_loop(i: int) -> list[Sample]:
            return [await one_request(client, system, user_tail(i, j), max_tokens,
                                      side.extra_body) for j in range(per_client)]

        started = time.perf_counter()
        results = await asyncio.gather(*(client_loop(i) for i in range(clients)))
        wall = time.perf_counter() - started
    return [s for samples in results for s in samples], wall


def summarize(samples: list[Sample], wall: float, max_tokens: int) -> dict:
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.tokens for s in ok)
    cached = [s.cached for s in ok if s.cached is not None]
    return {
        "requests": len(samples), "failures": len(samples) - len(ok),
        "short_replies": sum(1 for s in ok if s.tokens < max_tokens),
        "ttft_p50_s": round(percentile([s.ttft for s in ok], 50), 3),
        "ttft_p99_s": round(percentile([s.ttft for s in ok], 99), 3),
        "latency_p50_s": round(percentile([s.latency for s in ok], 50), 3),
        "latency_p99_s": round(percentile([s.latency for s in ok], 99), 3),
        "output_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "output_tokens": tokens, "wall_s": round(wall, 2),
        # prompt tokens served from the prefix cache, mean per request (ours reports them)
        "cached_prompt_tokens": round(sum(cached) / len(cached), 1) if cached else None,
        "errors": sorted({s.error for s in samples if s.error})[:3],
    }


def run_side(side: Side, system: str, levels: list[int], per_client: int,
             max_tokens: int) -> dict:
    """Start the side's server, warm it with one request, run every level, stop it."""
    result: dict = {}
    t = time.perf_counter()
    with server_process(side.command, side.port, env=side.env, health_path=side.health_path,
                        startup_timeout=1800.0) as server:
        warm = asyncio.run(run_level(server.url, side, system, 1, 1, max_tokens))[0][0]
        result["ready_s"] = round(time.perf_counter() - t, 1)
        if warm.error:
            raise RuntimeError(f"{side.name}: the warm-up request failed: {warm.error}\n"
                               f"{server.log()[-3000:]}")
        for clients in levels:
            samples, wall = asyncio.run(run_level(server.url, side, system, clients,
                                                  per_client, max_tokens))
            entry = summarize(samples, wall, max_tokens)
            result[str(clients)] = entry
            print(f"{side.name:>9} {clients:>4} clients: TTFT p50 {entry['ttft_p50_s']:.3f} s "
                  f"p99 {entry['ttft_p99_s']:.3f} s; latency p50 {entry['latency_p50_s']:.3f} s "
                  f"p99 {entry['latency_p99_s']:.3f} s; {entry['output_tok_s']:.1f} tok/s; "
                  f"{entry['failures']} failures, {entry['short_replies']} short"
                  + (f"; {entry['cached_prompt_tokens']} cached prompt tokens per request"
                     if entry["cached_prompt_tokens"] is not None else "")
                  + (f"; {entry['errors']}" if entry["errors"] else ""), flush=True)
    return result


def our_side(path: str, args: argparse.Namespace, levels: list[int]) -> Side:
    port = free_port()
    batch = args.max_batch_size or max(levels)
    options = ["--device", "cpu", "--dtype", args.dtype, "--quantization", args.quantization,
               "--served-model-name", SERVED_NAME, "--no-embeddings", "--log-level", "warning",
               "--max-batch-size", str(batch), "--max-waiting", str(max(levels) * 4),
               "--max-context-length", str(args.context)]
    return Side("ours", serve_command(path, port, *options), port,
                env={"OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"},
                extra_body={"ignore_eos": True, "stream_options": {"include_usage": True}})


def peer_side(path: str, args: argparse.Namespace, end_ids: list[int]) -> Side:
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", path,
               "--model_alias", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
               "--n_ctx", str(args.context), "--n_batch", "512",
               "--interrupt_requests", "False", "--verbose", "False"]
    return Side("llama.cpp", command, port, health_path="/v1/models",
                extra_body={"logit_bias": {str(i): -1e9 for i in end_ids}})


def ratios(ours: dict, peer: dict, levels: list[int]) -> dict:
    out = {}
    for level in map(str, levels):
        a, b = ours[level], peer[level]
        out[level] = {
            "tok_s": round(a["output_tok_s"] / b["output_tok_s"], 2) if b["output_tok_s"]
            else None,
            "ttft_p99": round(b["ttft_p99_s"] / a["ttft_p99_s"], 2) if a["ttft_p99_s"] else None,
            "latency_p99": round(b["latency_p99_s"] / a["latency_p99_s"], 2)
            if a["latency_p99_s"] else None,
        }
        print(f"ours vs llama.cpp, {level} clients: {out[level]['tok_s']}x tokens/s, p99 TTFT "
              f"{out[level]['ttft_p99']}x lower, p99 latency {out[level]['latency_p99']}x lower")
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2",
                        help="'smollm2', a .gguf file, or an HF folder (ours only)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clients", default="1,16,100",
                        help="concurrency levels, comma-separated (default 1,16,100)")
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--system-tokens", type=int, default=1500,
                        help="length of the shared system prompt (default 1500)")
    parser.add_argument("--context", type=int, default=4096, help="context of both servers")
    parser.add_argument("--quantization", default="auto", help="ours: --quantization")
    parser.add_argument("--dtype", default="auto", help="ours: --dtype")
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="ours: --max-batch-size (default: the largest level)")
    parser.add_argument("--skip-peer", action="store_true", help="run ours only")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    path = model_path(args.model)
    tokenizer = load_tokenizer(path)
    system = system_prompt(tokenizer, args.system_tokens)
    run_peer = not args.skip_peer and path.endswith(".gguf")
    if run_peer:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError as error:
            print(f"llama-cpp-python's server cannot start ({error}): build llama-cpp-python "
                  "with ../shared/tools/build-llama-cpp-python.sh .venv and install the bench "
                  "extra (sse-starlette, starlette-context, pydantic-settings)")
            raise SystemExit(2) from None
    print(f"model {path}; threads {args.threads}; system prompt "
          f"{len(tokenizer(system)['input_ids'])} tokens; {args.max_tokens} tokens per reply; "
          f"clients {levels} x {args.requests_per_client} requests", flush=True)
    result: dict = {"model": os.path.basename(path), "threads": args.threads,
                    "clients": levels, "requests_per_client": args.requests_per_client,
                    "max_tokens": args.max_tokens, "quantization": args.quantization}
    result["ours"] = run_side(our_side(path, args, levels), system, levels,
                              args.requests_per_client, args.max_tokens)
    if run_peer:
        result["peer"] = run_side(peer_side(path, args, end_token_ids(tokenizer)), system,
                                  levels, args.requests_per_client, args.max_tokens)
        result["ratios"] = ratios(result["ours"], result["peer"], levels)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
