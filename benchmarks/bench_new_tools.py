"""Forced tool calls whose schema the process has never seen: ours (new vs known) vs llama.cpp.

Agents get their tools per request (MCP servers, per-user tool sets, tool retrieval), so a new
schema must cost what a known one costs. 60 cases (``--cases``), each with its own function
(varied shapes: flat, enums, optional fields, arrays, nested objects, arrays of objects), are
called on SmolLM2's GGUF with ``bind_tools([schema], tool_choice=name)``:

* ``ours new``: the first call of each case's schema (nothing of it cached: grammar, prompt);
* ``ours known``: the same call again right after (grammar and prompt prefix cached);
* ``llama.cpp``: ``ChatLlamaCpp`` (langchain_community, llama-cpp-python) on the same GGUF file
  with the same forced tool (skipped when llama-cpp-python is not installed).

Every call is checked: one tool call, the forced name, arguments valid under the schema
(``jsonschema``), and scored: the fraction of the values the question names that the
arguments hold (``argument_accuracy``; a proxy for a function-calling suite's accuracy, to
compare prompt layouts and the peer). Our calls are split into stages by timing wrappers put around our own
functions for this run only: prompt rendering, tokenization, grammar parse, the compile (on
the compile thread, overlapped), the wait for it at the first mask, the mask work, the
prefill and decode passes and the rest. Both sides warm up on a schema of their own first.

Bars (issue 36): ours new <= 1.15 x ours known; ours new >= 1.5 x llama.cpp's speed; every
call valid. Run: ``python benchmarks/bench_new_tools.py [--cases 60] [--threads 2]``; prints a
table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import jsonschema
from langchain_core.messages import HumanMessage

_VERBS = ["get", "find", "book", "list", "create", "update", "cancel", "check", "send", "track",
          "compute", "search", "schedule", "convert", "rate", "order"]
_NOUNS = ["flight", "hotel", "invoice", "parcel", "meeting", "recipe", "ticket", "song",
          "account", "forecast", "route", "stock", "review", "course", "car", "museum"]
_CITIES = ["Paris", "Lima", "Osaka", "Cairo", "Oslo", "Quito", "Perth", "Dakar"]


def _field(rng: random.Random, depth: int) -> tuple[dict[str, Any], str, Any]:
    """One property schema of a random shape, a value to mention in the question and the
    argument that value means."""
    shape = rng.choice(["string", "integer", "number", "boolean", "enum", "array", "object",
                        "array_of_objects"] if depth == 0 else
                       ["string", "integer", "enum", "boolean"])
    if shape == "string":
        city = rng.choice(_CITIES)
        return {"type": "string", "description": "a name or place"}, city, city
    if shape == "integer":
        n = rng.randint(1, 40)
        return {"type": "integer", "description": "a count"}, str(n), n
    if shape == "number":
        amount = rng.randint(1, 99) + 0.5
        return {"type": "number", "description": "an amount"}, str(amount), amount
    if shape == "boolean":
        return {"type": "boolean", "description": "a yes/no switch"}, "yes", True
    if shape == "enum":
        options = rng.sample(["low", "medium", "high", "red", "green", "blue", "economy",
                              "business", "first", "celsius", "fahrenheit"], 3)
        return {"type": "string", "enum": options}, options[0], options[0]
    if shape == "array":
        cities = rng.sample(_CITIES, 2)
        return ({"type": "array", "items": {"type": "string"}, "description": "a list"},
                " and ".join(cities), cities)
    inner, hint, value = _object(rng, depth + 1, rng.randint(1, 3))
    if shape == "object":
        return inner, hint, value
    return ({"type": "array", "items": inner, "description": "a list of items"}, hint,
            [value])


def _object(rng: random.Random, depth: int, size: int,
            ) -> tuple[dict[str, Any], str, dict[str, Any]]:
    properties: dict[str, Any] = {}
    hints = []
    values: dict[str, Any] = {}
    words = rng.sample(["city", "date", "count", "level", "mode", "owner", "budget", "tags",
                        "origin", "target", "notes", "priority", "seats", "color", "urgent",
                        "language", "currency", "limit", "items", "contact"], size)
    for word in words:
        schema, hint, value = _field(rng, depth)
        properties[word] = schema
        hints.append(f"{word} {hint}")
        values[word] = value
    required = [w for w in words if rng.random() < 0.6] or [words[0]]  # the rest optional
    return ({"type": "object", "properties": properties, "required": required},
            ", ".join(hints), values)


def make_cases(count: int, seed: int = 36) -> list[tuple[dict[str, Any], str]]:
    """``count`` (OpenAI tool dict, question) pairs; every function name and schema unique."""
    return [(tool, question) for tool, question, _ in make_cases_with_answers(count, seed)]


def make_cases_with_answers(count: int, seed: int = 36,
                            ) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """:func:`make_cases` with each question's intended arguments (every value it names)."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{i}"
        parameters, hint, answer = _object(rng, 0, rng.randint(1, 4))
        tool = {"type": "function", "function": {
            "name": name, "description": f"{name.replace('_', ' ')} for the user",
            "parameters": parameters}}
        cases.append((tool, f"Please {name.rsplit('_', 1)[0].replace('_', ' ')}: {hint}.",
                      answer))
    return cases


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """``{path: scalar}`` of a JSON value (lists indexed, strings compared case-folded)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _leaves(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{path}[{i}]").items()}
    return {path: value.casefold() if isinstance(value, str) else value}


def argument_accuracy(reply: Any, answer: dict[str, Any]) -> float:
    """Fraction of the intended arguments' values the call got right (0 without a call)."""
    calls = getattr(reply, "tool_calls", None) or []
    if len(calls) != 1:
        return 0.0
    want, got = _leaves(answer), _leaves(calls[0]["args"])
    return sum(got.get(k) == v for k, v in want.items()) / len(want)


def call_is_valid(reply: Any, tool: dict[str, Any]) -> bool:
    """One tool call, of the forced function, with arguments valid under its schema."""
    calls = getattr(reply, "tool_calls", None) or []
    if len(calls) != 1 or calls[0]["name"] != tool["function"]["name"]:
        return False
    try:
        jsonschema.validate(calls[0]["args"], tool["function"]["parameters"])
    except jsonschema.ValidationError:
        return False
    return True


class Stages:
    """Seconds spent in named stages, from wrappers put around functions for this run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner: Any, name: str, stage: str | Callable[..., str]) -> None:
        original = getattr(owner, name, None)
        if original is None:  # another version of the package: that stage is not shown
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                label = stage(*args, **kwargs) if callable(stage) else stage
                self.seconds[label] += time.perf_counter() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def instrument_ours(stages: Stages) -> None:
    """Wrap our request path's stages (this process only)."""
    from langchain_ascend import chat_models
    from langchain_ascend.chat import prepare, reply
    from langchain_ascend.engine.worker.model_runner import ModelRunner
    from langchain_ascend.structured import xgrammar_backend, xgrammar_constraint

    backend_cls = xgrammar_backend.GrammarBackend
    constraint_cls = xgrammar_constraint.XGrammarConstraint
    stages.wrap(chat_models, "prepare_request", "request preparation (all of it)")
    stages.wrap(prepare, "prompt_token_ids", "render + tokenize prompt")
    stages.wrap(prepare, "render_prompt", "render prompt (of which)")
    stages.wrap(backend_cls, "check", "grammar schema check")
    stages.wrap(backend_cls, "_compile_now", "grammar compile (compile thread)")
    stages.wrap(constraint_cls, "mask_logits", "grammar masks")
    stages.wrap(constraint_cls, "jump_forward", "grammar jump-forward")
    stages.wrap(reply.ReplyAssembler, "finish", "reply assembly")

    def step_kind(runner: Any, batch: Any) -> str:
        tokens = sum(len(s.token_ids) for s in batch.segments)
        return "model prefill pass" if tokens > 1 else "model decode pass"

    stages.wrap(ModelRunner, "execute", step_kind)
    original_matcher = getattr(constraint_cls, "_matcher", None)
    if not isinstance(original_matcher, property):
        return

    def matcher(self: Any) -> Any:
        if self.has_matcher:
            return original_matcher.fget(self)
        start = time.perf_counter()
        try:
            return original_matcher.fget(self)
        finally:
            stages.seconds["grammar wait at first mask"] += time.perf_counter() - start

    constraint_cls._matcher = property(matcher)


def sample_value(schema: dict[str, Any]) -> Any:
    """A small value valid under one of :func:`make_cases`' schemas (required fields only)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema["type"]
    if kind == "object":
        return {k: sample_value(schema["properties"][k]) for k in schema["required"]}
    if kind == "array":
        return [sample_value(schema["items"])]
    return {"string": "Paris", "integer": 3, "number": 2.5, "boolean": True}[kind]


def grammar_only(count: int) -> None:
    """The grammar work of each case's call alone, no model: an eager compile (every mask
    built up front, what the package did before) vs ours (dynamic compile, masks built as the
    call reaches them), each then driven through the call's tokens by our constraint (masks,
    budget guard, jump-forward), interleaved case by case."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from langchain_ascend.structured.grammars import tool_call_grammar
    from langchain_ascend.structured.xgrammar_backend import GrammarBackend
    from langchain_ascend.testing.real_model import smollm2_path
    from langchain_ascend.tool_formats.hermes import HermesFormat

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path(progress=False))
    start = time.perf_counter()
    backend = GrammarBackend(tokenizer, vocab_size=len(tokenizer),
                             stop_token_ids=[tokenizer.eos_token_id])
    print(f"per model, once: tokenizer info, compiler and policy masks "
          f"{(time.perf_counter() - start) * 1000:.0f} ms")
    eager = xgr.GrammarCompiler(backend.tokenizer_info, max_threads=2)

    import torch

    logits = torch.zeros(backend.vocab_size)  # (V,) one row, masked again and again

    def drive(constraint: Any, ids: list[int]) -> None:
        position = 0
        while position < len(ids):
            forced = constraint.jump_forward(len(ids))
            if forced:
                position += len(forced)
                continue
            constraint.mask_logits(logits)
            constraint.accept_token(ids[position])
            position += 1

    totals: dict[str, float] = defaultdict(float)
    for tool, _question in make_cases(count):
        name = tool["function"]["name"]
        spec = tool_call_grammar([tool], fmt="hermes", tool_name=name)
        text = HermesFormat.render_call(name, sample_value(tool["function"]["parameters"]))
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        for side in ("eager", "ours", "ours known"):
            start = time.perf_counter()
            if side == "eager":
                compiled = eager.compile_structural_tag(spec.source)
                constraint = xgrammar_constraint_for(backend, compiled, spec)
            else:
                constraint = backend.new_constraint(spec, max_tokens=256)
            drive(constraint, ids)
            assert constraint.is_terminated() and constraint.rejected_token is None, side
            totals[side] += time.perf_counter() - start
    for side, seconds in totals.items():
        print(f"  {side:11s} {seconds / count * 1000:7.2f} ms of grammar work per call")
    print(json.dumps({"grammar_ms_per_call": {k: v / count * 1000 for k, v in totals.items()}}))


def xgrammar_constraint_for(backend: Any, compiled: Any, spec: Any) -> Any:
    from langchain_ascend.structured.packed_masks import pack_mask
    from langchain_ascend.structured.xgrammar_constraint import XGrammarConstraint

    return XGrammarConstraint(compiled, backend=backend, base_mask=pack_mask(~backend._special),
                              max_tokens=256)


def build_ours(max_tokens: int) -> Any:
    from langchain_ascend import AscendChatModel
    from langchain_ascend.testing.real_model import smollm2_chat_kwargs

    chat = AscendChatModel(**smollm2_chat_kwargs(max_tokens=max_tokens))
    chat.warm_up()
    return chat


def build_llamacpp(threads: int, max_tokens: int) -> Any:
    from langchain_community.chat_models import ChatLlamaCpp

    from langchain_ascend.testing.real_model import smollm2_gguf_path

    return ChatLlamaCpp(model_path=str(smollm2_gguf_path()), n_ctx=4096, n_threads=threads,
                        n_batch=512, temperature=0.0, max_tokens=max_tokens, verbose=False,
                        model_kwargs={"n_threads_batch": threads})


def forced(chat: Any, tool: dict[str, Any]) -> Any:
    name = tool["function"]["name"]
    return chat.bind_tools([tool], tool_choice={"type": "function", "function": {"name": name}})


def timed_call(chat: Any, tool: dict[str, Any], question: str) -> tuple[float, Any]:
    bound = forced(chat, tool)
    start = time.perf_counter()
    reply = bound.invoke([HumanMessage(question)])
    return time.perf_counter() - start, reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256,
                        help="both sides' max_tokens (ours defaults to none; a tight budget "
                        "makes our budget guard simulate closings, ~1 ms a token)")
    parser.add_argument("--no-llamacpp", action="store_true")
    parser.add_argument("--grammar-only", action="store_true",
                        help="time the grammar work alone (eager compile vs ours), no model")
    args = parser.parse_args()
    if args.grammar_only:
        grammar_only(args.cases)
        return

    cases = make_cases_with_answers(args.cases)
    warm_tool, warm_question = make_cases(1, seed=1)[0]
    ours = build_ours(args.max_tokens)
    stages = Stages()
    instrument_ours(stages)
    timed_call(ours, warm_tool, warm_question)  # first-call costs (tokenizer info, masks)
    peer = None
    if not args.no_llamacpp:
        try:
            import llama_cpp  # noqa: F401
            peer = build_llamacpp(args.threads, args.max_tokens)
            timed_call(peer, warm_tool, warm_question)
        except ImportError:
            print("llama-cpp-python is not installed: llama.cpp side skipped")
    stages.take()

    rows = []
    new_stages: dict[str, float] = defaultdict(float)
    known_stages: dict[str, float] = defaultdict(float)
    for tool, question, answer in cases:
        new_s, new_reply = timed_call(ours, tool, question)
        for k, v in stages.take().items():
            new_stages[k] += v
        known_s, known_reply = timed_call(ours, tool, question)
        for k, v in stages.take().items():
            known_stages[k] += v
        row = {"name": tool["function"]["name"], "new_s": new_s, "known_s": known_s,
               "new_valid": call_is_valid(new_reply, tool),
               "known_valid": call_is_valid(known_reply, tool),
               "new_accuracy": argument_accuracy(new_reply, answer),
               "prompt_tokens": new_reply.usage_metadata["input_tokens"],
               "output_tokens": new_reply.usage_metadata["output_tokens"]}
        if peer is not None:
            peer_s, peer_reply = timed_call(peer, tool, question)
            row.update(peer_s=peer_s, peer_valid=call_is_valid(peer_reply, tool),
                       peer_accuracy=argument_accuracy(peer_reply, answer))
        rows.append(row)
        print(json.dumps(row))

    n = len(rows)
    total = {k: sum(r[k] for r in rows) for k in ("new_s", "known_s", "peer_s") if k in rows[0]}
    print(f"\n{n} cases, each with a function never seen before (SmolLM2 Q4_1 GGUF, "
          f"{args.threads} threads)")
    print(f"ours new schema:   {total['new_s']:.2f} s total, {total['new_s'] / n * 1000:.0f} "
          f"ms/call (median {statistics.median(r['new_s'] for r in rows) * 1000:.0f}), "
          f"valid {sum(r['new_valid'] for r in rows)}/{n}")
    print(f"ours known schema: {total['known_s']:.2f} s total, "
          f"{total['known_s'] / n * 1000:.0f} ms/call, valid "
          f"{sum(r['known_valid'] for r in rows)}/{n}")
    result = {"cases": n, "ours_new_s": total["new_s"], "ours_known_s": total["known_s"],
              "new_over_known": total["new_s"] / total["known_s"],
              "ours_valid": sum(r["new_valid"] for r in rows),
              "ours_accuracy": statistics.mean(r["new_accuracy"] for r in rows)}
    print(f"ours argument accuracy (values the question names): {result['ours_accuracy']:.3f}")
    print(f"new / known: {result['new_over_known']:.3f} (bar <= 1.15)")
    if "peer_s" in total:
        result.update(llamacpp_s=total["peer_s"], llamacpp_valid=sum(r["peer_valid"]
                                                                       for r in rows),
                      speed_vs_llamacpp=total["peer_s"] / total["new_s"],
                      llamacpp_accuracy=statistics.mean(r["peer_accuracy"] for r in rows))
        print(f"llama.cpp:         {total['peer_s']:.2f} s total, "
              f"{total['peer_s'] / n * 1000:.0f} ms/call, valid {result['llamacpp_valid']}/{n}, "
              f"argument accuracy {result['llamacpp_accuracy']:.3f}")
        print(f"ours (new schemas) vs llama.cpp: {result['speed_vs_llamacpp']:.2f}x "
              "(bar >= 1.5)")
    print("\nper-stage ms per call (ours; compile runs on the compile thread, overlapped):")
    for name in sorted(set(new_stages) | set(known_stages)):
        print(f"  {name:36s} new {new_stages.get(name, 0) / n * 1000:8.2f}   known "
              f"{known_stages.get(name, 0) / n * 1000:8.2f}")
    result["stages_new_ms"] = {k: v / n * 1000 for k, v in new_stages.items()}
    result["stages_known_ms"] = {k: v / n * 1000 for k, v in known_stages.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
