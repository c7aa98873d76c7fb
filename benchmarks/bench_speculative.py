"""Tokens per forward pass: speculative decoding (prompt lookup) vs plain decoding vs HF.

Workloads, all greedy, one process, the same weights on both sides:

* ``copy``: a tool result of ~60 words in the conversation, and the user asks for it restated
  exactly (what an agent's last hop often does). Ours with ``speculative_decoding`` ``"auto"``
  and ``"prompt_lookup"`` vs ``"off"``; the peer is HF ``generate`` on the same prompt ids,
  plain and with ``prompt_lookup_num_tokens=4``.
* ``novel``: free writing with little to copy, where drafts mostly fail: the cost of drafting
  (``"prompt_lookup"``) and what ``"auto"`` saves of it.
* ``tool_call``: a forced tool call (grammar-constrained JSON); reports forward passes per
  generated token (grammar rows do not draft; jump-forward would cut this).

"cold": the prefix cache is reset before every call of ours (HF has none); "warm": the prompt
is already cached, as on an agent's next hop. Each measurement is the median of ``--rounds``
interleaved rounds. The text of every speculative run is checked equal to the plain run.

Run: ``python benchmarks/bench_speculative.py [--model PATH|smollm2] [--dtype float32|bfloat16]
[--rounds 3] [--max-tokens 96]``. Prints one line per measurement, the ratios, and a final
JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

TOOL_RESULT = (
    "Order 48213-B for Dr. Mei Lin Zhao shipped on 14 March from the Shenzhen warehouse "
    "(dock 7) by SF Express, tracking number SF1402875531CN. Contents: two Atlas 300I Duo "
    "inference cards, one 2 m QSFP-DD cable, and the quick start guide. Estimated delivery "
    "to 88 Keyuan Road, Nanshan District, is 17 March before 18:00; a signature is required "
    "and the customs declaration was filed as category 8471.80."
)


def copy_messages() -> list[BaseMessage]:
    return [
        SystemMessage("You are a precise assistant. When asked to restate text, copy it "
                      "exactly, word for word."),
        HumanMessage(f"The order tool returned:\n\n{TOOL_RESULT}\n\nRestate the tool result "
                     "exactly, word for word, with nothing before or after it."),
    ]


def novel_messages() -> list[BaseMessage]:
    return [
        SystemMessage("You are a creative writer."),
        HumanMessage("Write a short story about a lighthouse keeper who befriends a whale."),
    ]


def resolve_bench_model(model: str | None) -> str:
    from langchain_ascend.engine.model_source import resolve_model_source

    if model in (None, "smollm2"):
        from langchain_ascend.testing import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    return str(resolve_model_source(model).path)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median(values: list[float]) -> float:
    return statistics.median(values)


def run_ours(chat: Any, messages: list[BaseMessage], mode: str, *, cold: bool,
             **kwargs: Any) -> tuple[float, Any]:
    if cold:
        chat._engine_for().reset_prefix_cache()
    return timed(lambda: chat.invoke(messages, speculative_decoding=mode, **kwargs))


def hf_generate(model: Any, ids: Any, max_new_tokens: int, lookup: int | None,
                eos: list[int]) -> tuple[float, list[int]]:
    import torch

    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False,
                              "eos_token_id": eos, "pad_token_id": eos[0]}
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    with torch.inference_mode():
        seconds, out = timed(lambda: model.generate(
            ids, attention_mask=torch.ones_like(ids), **kwargs))
    return seconds, out[0, ids.shape[1]:].tolist()


def per_pass(message: Any) -> float:
    spec = message.response_metadata.get("speculative") or {}
    passes = spec.get("forward_passes") or 0
    return message.usage_metadata["output_tokens"] / passes if passes else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2",
                        help="HF folder or .gguf file, or 'smollm2' (default)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langchain_ascend import AscendChatModel

    path = resolve_bench_model(args.model)
    ours = AscendChatModel(model=path, device=args.device, dtype=args.dtype, temperature=0,
                           max_tokens=args.max_tokens, max_context_length=2048,
                           max_batch_size=8)
    tok = AutoTokenizer.from_pretrained(path)
    peer = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    peer.to(args.device)
    eos = [t for t in [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
           if isinstance(t, int) and t >= 0]
    ours.invoke("warm up", max_tokens=4)
    result: dict[str, Any] = {"model": path, "dtype": args.dtype, "device": args.device,
                              "max_tokens": args.max_tokens, "workloads": {}}

    for name, messages in (("copy", copy_messages()), ("novel", novel_messages())):
        rows: dict[str, dict[str, list[float]]] = {}
        texts: dict[str, str] = {}
        tpp: dict[str, float] = {}
        template = [{"role": "system" if isinstance(m, SystemMessage) else "user",
                     "content": m.content} for m in messages]
        ids = tok.apply_chat_template(template, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"].to(args.device)
        for _ in range(args.rounds):
            for mode in ("off", "prompt_lookup", "auto"):
                for cold in (True, False):
                    seconds, msg = run_ours(ours, messages, mode, cold=cold)
                    rows.setdefault(f"ours_{mode}", {}).setdefault(
                        "cold" if cold else "warm", []).append(seconds)
                    texts[mode] = str(msg.content)
                    tpp[mode] = per_pass(msg)
            for lookup in (None, 4):
                seconds, hf_ids = hf_generate(peer, ids, args.max_tokens, lookup, eos)
                key = "hf_prompt_lookup" if lookup else "hf_plain"
                rows.setdefault(key, {}).setdefault("cold", []).append(seconds)
                texts[key] = tok.decode(hf_ids, skip_special_tokens=True)
        summary = {key: {phase: median(v) for phase, v in value.items()}
                   for key, value in rows.items()}
        same = {mode: texts[mode] == texts["off"] for mode in ("prompt_lookup", "auto")}
        off = summary["ours_off"]
        ratios = {
            "prompt_lookup_vs_off_warm": off["warm"] / summary["ours_prompt_lookup"]["warm"],
            "auto_vs_off_warm": off["warm"] / summary["ours_auto"]["warm"],
            "prompt_lookup_vs_off_cold": off["cold"] / summary["ours_prompt_lookup"]["cold"],
            "auto_vs_hf_prompt_lookup_cold": (summary["hf_prompt_lookup"]["cold"]
                                              / summary["ours_auto"]["cold"]),
            "auto_vs_hf_plain_cold": summary["hf_plain"]["cold"] / summary["ours_auto"]["cold"],
            "hf_prompt_lookup_vs_hf_plain": (summary["hf_plain"]["cold"]
                                             / summary["hf_prompt_lookup"]["cold"]),
        }
        print(f"\n[{name}] {len(texts['off'].split())} words; same text as off: {same}; "
              f"tokens/pass: {', '.join(f'{k} {v:.2f}' for k, v in tpp.items())}")
        for key, value in summary.items():
            print(f"  {key:18s} " + "  ".join(f"{p} {s * 1000:8.1f} ms" for p, s in value.items()))
        for key, value in ratios.items():
            print(f"  {key:32s} {value:5.2f}x")
        result["workloads"][name] = {"seconds": summary, "ratios": ratios, "same_text": same,
                                     "tokens_per_pass": tpp,
                                     "hf_same_text_as_ours": texts["hf_plain"] == texts["off"]}

    tool = {"type": "function", "function": {
        "name": "track_order", "description": "Look up an order by its id.",
        "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string", "description": "The order id, e.g. 48213-B"}},
            "required": ["order_id"]}}}
    bound = ours.bind_tools([tool], tool_choice="track_order")
    question = [HumanMessage("Where is my order 48213-B?")]
    seconds = []
    msg = None
    for _ in range(args.rounds):
        s, msg = timed(lambda: bound.invoke(question))
        seconds.append(s)
    assert msg is not None
    spec = msg.response_metadata.get("speculative", {})
    out_tokens = msg.usage_metadata["output_tokens"]
    passes = spec.get("forward_passes") or out_tokens
    print(f"\n[tool_call] {msg.tool_calls}; {out_tokens} tokens in {passes} passes "
          f"({passes / out_tokens:.2f} passes/token, forced {spec.get('forced_tokens', 0)}); "
          f"{median(seconds) * 1000:.1f} ms")
    result["workloads"]["tool_call"] = {"seconds": median(seconds), "output_tokens": out_tokens,
                                        "forward_passes": passes,
                                        "passes_per_token": passes / out_tokens,
                                        "forced_tokens": spec.get("forced_tokens", 0)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
