"""One stream, ours vs llama.cpp on the same GGUF file, each side in a fresh process.

What a user sees with one model and one conversation, at any file size:

* ``load_s``: from constructing the model (library imported) to the first token of a short
  prompt streamed back; ``import_s`` (importing the library) reported beside it;
* ``prefill_tok_s``: a ``--prompt-tokens`` (1024) prompt, no prefix shared with anything run
  before, to its first token; the best of two such prompts;
* ``decode_tok_s``: ``--decode-tokens`` greedy tokens after a short prompt, first token to last
  (EOS ignored: ours ``ignore_eos``, the peer's ``Llama.generate`` never stops by itself), and
  its ``fraction_of_floor``: the memory-bandwidth floor of :mod:`membw`, the read bandwidth
  measured in this run with the same threads;
* ``peak_rss_mb``: the child's ``VmHWM`` at the end;
* ``loadavg_1m``: the machine's 1-minute load average when the child started and ended. Read
  it before any ratio: with more runnable threads than cores llama.cpp's per-op thread
  barriers collapse (2-5 tok/s instead of ~45 on the 1B file at load ~3 on 2 cores) while
  ours loses little, so a loaded run overstates our lead.

Ours is the ``LLMEngine`` of an ``AscendChatModel`` (``quantization=mode``, the CPU,
``max_context_length`` = the peer's ``n_ctx``, other settings at their defaults), fed token
ids through ``engine.stream``; the peer is
``llama_cpp.Llama`` (``n_ctx``, ``n_threads`` = ``n_threads_batch`` = threads, ``n_batch``
512). Both get the same token ids (the docs of this repository, tokenized by the file's own
tokenizer as the engine builds it) and the same threads: ``torch.set_num_threads`` and
``OMP_NUM_THREADS`` for ours.

The parent runs the children alternately (peer, ours, peer, ours ... for ``repeats``), so a
burst of load from other users of the machine falls on both sides; the best of each side's
runs is reported, every run kept in the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from child_process import peak_rss_mb

HERE = os.path.dirname(os.path.abspath(__file__))
N_CTX = 4096
SHORT = 16  # tokens of the short prompts (load probe, decode)


def prompt_ids(path: str, prompt_tokens: int) -> dict:
    """The token ids every child runs: three short prompts and two long ones, from
    disjoint stretches of the repository's docs (no prefix shared between any two)."""
    from pathlib import Path

    from bench_corpus import docs_text

    from langchain_ascend.engine.model_source.gguf_tokenizer import gguf_tokenizer

    tokenizer = gguf_tokenizer(Path(path))
    ids = list(tokenizer(docs_text(), add_special_tokens=False)["input_ids"])
    need = 2 * prompt_tokens + 2 * SHORT
    while len(ids) < need:  # a small docs folder: repeat it, shifted so no prefix repeats
        ids = ids + ids[1:]
    return {"load": ids[:SHORT], "prefill": [ids[SHORT + i * prompt_tokens:
                                                 SHORT + (i + 1) * prompt_tokens]
                                             for i in range(2)],
            "decode": ids[SHORT + 2 * prompt_tokens:2 * SHORT + 2 * prompt_tokens]}


# ------------------------------------------------------------------------------ children


class _Ours:
    def __init__(self, path: str, mode: str, dtype: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        from langchain_ascend import AscendChatModel
        from langchain_ascend.engine.core.sampling_params import SamplingParams

        self.params = SamplingParams
        chat = AscendChatModel(model=path, device="cpu", dtype=dtype, temperature=0.0,
                               max_context_length=N_CTX,
                               quantization=None if mode == "none" else mode)
        self.engine = chat.get_engine()  # the LLMEngine a user's chat model runs on

    def stream(self, ids: list[int], max_tokens: int):
        """Yield the count of new tokens each time some arrive."""
        params = self.params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        for delta in self.engine.stream(ids, params):
            if delta.token_ids:
                yield len(delta.token_ids)

    def close(self) -> None:
        self.engine.shutdown()


class _Peer:
    def __init__(self, path: str, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=N_CTX, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, verbose=False)

    def stream(self, ids: list[int], max_tokens: int):
        produced = 0
        for _token in self.llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            yield 1
            produced += 1
            if produced >= max_tokens:
                return

    def close(self) -> None:
        self.llm.close()


def _first_token_s(side, ids: list[int]) -> float:
    t = time.perf_counter()
    for _ in side.stream(ids, 1):
        break
    return time.perf_counter() - t


def child(side_name: str, path: str, mode: str, dtype: str, threads: int, ids_file: str,
          decode_tokens: int) -> dict:
    """Everything one side measures, in this (fresh) process."""
    with open(ids_file) as f:
        ids = json.load(f)
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    if side_name == "ours":
        import torch  # noqa: F401

        from langchain_ascend import AscendChatModel  # noqa: F401
    else:
        import llama_cpp  # noqa: F401
    import_s = time.perf_counter() - t
    t = time.perf_counter()
    side = _Ours(path, mode, dtype, threads) if side_name == "ours" else _Peer(path, threads)
    _first_token_s(side, ids["load"])
    load_s = time.perf_counter() - t
    prefill_s = [_first_token_s(side, p) for p in ids["prefill"]]
    stamps, count = [], 0
    for n in side.stream(ids["decode"], decode_tokens):
        count += n
        stamps.append((time.perf_counter(), count))
    side.close()
    (t_first, n_first), (t_last, n_last) = stamps[0], stamps[-1]
    return {"import_s": round(import_s, 2), "load_s": round(load_s, 2),
            "prefill_tok_s": round(len(ids["prefill"][0]) / min(prefill_s), 1),
            "prefill_s": [round(s, 2) for s in prefill_s],
            "decode_tok_s": round((n_last - n_first) / (t_last - t_first), 2),
            "decode_tokens": n_last, "peak_rss_mb": round(peak_rss_mb(), 1),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def run_child(side: str, path: str, mode: str, dtype: str, threads: int, ids_file: str,
              decode_tokens: int, extra_env: dict[str, str] | None = None) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {HERE!r})\n"
            "import single_stream as s\n"
            f"r = s.child({side!r}, {path!r}, {mode!r}, {dtype!r}, {threads}, {ids_file!r}, "
            f"{decode_tokens})\n"
            "print('CHILD_RESULT ' + json.dumps(r))\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(extra_env or {}))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{side} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.rsplit("CHILD_RESULT ", 1)[1].splitlines()[0])


def _bandwidth(threads: int) -> tuple[float, str]:
    code = (f"import sys; sys.path.insert(0, {HERE!r})\n"
            "import membw\n"
            f"g, how = membw.read_bandwidth_gbs({threads})\n"
            "print('BW', g, how)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    gbs, how = out.rsplit("BW ", 1)[1].split()[:2]
    return float(gbs), how


def best(runs: list[dict]) -> dict:
    """Each figure's best over the runs (fastest, smallest)."""
    low = ("import_s", "load_s", "peak_rss_mb")
    return {k: (min if k in low else max)(r[k] for r in runs)
            for k in ("import_s", "load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb")}


def run_stream(path: str, modes: list[str], dtype: str, threads: int, *, prompt_tokens: int,
               decode_tokens: int, repeats: int) -> dict:
    """Measure both sides alternately; print each run and the ratios; return the JSON part."""
    import tempfile

    from membw import decode_step_bytes

    step = decode_step_bytes(path)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompt_ids(path, prompt_tokens), f)
        ids_file = f.name
    bandwidths: list[float] = []
    how = ""
    runs: dict[str, list[dict]] = {"peer": [], **{m: [] for m in modes}}
    try:
        for r in range(repeats):
            gbs, how = _bandwidth(threads)
            bandwidths.append(gbs)
            print(f"[{r}] read bandwidth {gbs:.1f} GB/s ({how}, {threads} threads)", flush=True)
            for side in ("peer", *modes):
                name = "peer" if side == "peer" else "ours"
                got = run_child(name, path, side, dtype, threads, ids_file, decode_tokens)
                runs[side].append(got)
                print(f"[{r}] {'llama.cpp' if side == 'peer' else 'ours ' + side}: {got}",
                      flush=True)
    finally:
        os.unlink(ids_file)
    bandwidth = max(bandwidths)
    floor = bandwidth * 1e9 / step["step_bytes"]
    result = {"threads": threads, "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens,
              "bandwidth_gbs": round(bandwidth, 1), "bandwidth_runs_gbs":
              [round(b, 1) for b in bandwidths], "bandwidth_method": how,
              "step_bytes": step["step_bytes"], "floor_tok_s": round(floor, 2), "n_ctx": N_CTX,
              "peer": {**best(runs["peer"]), "runs": runs["peer"]}, "ours": {}}
    peer = result["peer"]
    peer["fraction_of_floor"] = round(peer["decode_tok_s"] / floor, 3)
    print(f"floor: {step['step_bytes'] / 1e6:.0f} MB a step / {bandwidth:.1f} GB/s = "
          f"{floor:.2f} tok/s")
    print(f"llama.cpp best: {_line(peer)}")
    for mode in modes:
        ours = {**best(runs[mode]), "runs": runs[mode]}
        ours["fraction_of_floor"] = round(ours["decode_tok_s"] / floor, 3)
        ours["decode_ratio"] = round(ours["decode_tok_s"] / peer["decode_tok_s"], 2)
        ours["prefill_ratio"] = round(ours["prefill_tok_s"] / peer["prefill_tok_s"], 2)
        ours["load_over_peer_s"] = round(ours["load_s"] - peer["load_s"], 2)
        ours["rss_over_peer_mb"] = round(ours["peak_rss_mb"] - peer["peak_rss_mb"], 1)
        result["ours"][mode] = ours
        print(f"ours {mode} best: {_line(ours)}; decode {ours['decode_ratio']}x, prefill "
              f"{ours['prefill_ratio']}x, load {ours['load_over_peer_s']:+.2f} s, RSS "
              f"{ours['rss_over_peer_mb']:+.0f} MB vs llama.cpp")
    return result


def _line(side: dict) -> str:
    return (f"load {side['load_s']:.2f} s (+import {side['import_s']:.2f} s), prefill "
            f"{side['prefill_tok_s']:.1f} tok/s, decode {side['decode_tok_s']:.2f} tok/s "
            f"({100 * side['fraction_of_floor']:.0f}% of floor), peak RSS "
            f"{side['peak_rss_mb']:.0f} MB")
