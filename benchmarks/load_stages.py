"""Where the load of a GGUF model goes, stage by stage, in a fresh process (issue 34).

``python benchmarks/load_stages.py FILE.gguf [--threads 2]`` times what a user waits for:
importing torch and the package, constructing ``AscendChatModel(model=FILE)`` up to its
engine, and the first token of a 16-token prompt; inside the construction it times (wall,
seconds; inclusive, so the rows overlap where one stage calls another):

* the transformers modules imported while constructing (counted; an owned family's GGUF
  file needs none of its config or modeling modules: ``engine.cpu.models.llama_weights``);
* ``header``: ``quant.gguf_file.read_header`` (parsed once per file version);
* ``config``, ``skeleton``, ``fill``: ``quant.gguf_model``'s config and transformers' module
  tree with meta weights (a family without an owned model only), and the weights from the
  file's map;
* ``cpu prepare``: ``engine.cpu.prepare`` (fusing, the x8 re-laying, the decoder), and within
  it ``re-lay (fused groups)``: the groups' concatenation (into x8, or a copy in the file's
  layout), ``re-lay (all)``: every ``quant.formats.to_layout`` (most of the former too);
* ``tokenizer``: ``engine.model_source.folder_tokenizer`` on the blocks folder;
* ``kernels``: ``native.build.load`` (a cached build: loading the library).

The timers wrap those functions in this process only (attributes of the modules, looked up
when called); nothing of the package changes. Run it twice: the first run on a machine builds
the native kernels and the blocks folder (``LANGCHAIN_ASCEND_CACHE``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time

SHORT_PROMPT = list(range(100, 116))


def _timed(totals: dict[str, float], name: str, module, attribute: str) -> None:
    original = getattr(module, attribute)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    setattr(module, attribute, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    totals: dict[str, float] = collections.defaultdict(float)
    start = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from langchain_ascend import AscendChatModel
    from langchain_ascend.engine.core.sampling_params import SamplingParams

    totals["import torch + langchain_ascend"] = time.perf_counter() - start
    from langchain_ascend.engine import loader
    from langchain_ascend.engine.cpu import fused_projections
    from langchain_ascend.engine.worker import hooks
    from langchain_ascend.native import build
    from langchain_ascend.quant import formats, gguf_file, gguf_model

    _timed(totals, "header", gguf_file, "_cached_header")
    _timed(totals, "config", gguf_model, "load_gguf_config")
    _timed(totals, "skeleton", gguf_model, "_skeleton")
    _timed(totals, "fill", gguf_model._Filler, "fill")
    _timed(totals, "cpu prepare", hooks, "prepare")
    _timed(totals, "re-lay (fused groups)", fused_projections, "concatenate")
    _timed(totals, "re-lay (all)", formats, "to_layout")
    _timed(totals, "kernels", build, "load")
    _timed(totals, "tokenizer", loader, "load_folder_tokenizer")
    before = set(sys.modules)
    start = time.perf_counter()
    chat = AscendChatModel(model=args.model, device="cpu", temperature=0.0,
                           max_context_length=4096)
    engine = chat.get_engine()
    totals["construct (all)"] = time.perf_counter() - start
    imported = [m for m in set(sys.modules) - before if m.startswith("transformers")]
    family_modules = sorted(m for m in imported if m.startswith("transformers.models."))
    start = time.perf_counter()
    for delta in engine.stream(SHORT_PROMPT, SamplingParams(max_tokens=1, temperature=0.0,
                                                            ignore_eos=True)):
        if delta.token_ids:
            break
    totals["first token"] = time.perf_counter() - start
    engine.shutdown()
    print(f"{os.path.basename(args.model)}, {args.threads} threads, 1-minute load "
          f"{os.getloadavg()[0]:.2f}")
    for name, seconds in totals.items():
        print(f"  {name:32s} {seconds:6.2f} s")
    print(f"  transformers modules imported while constructing: {len(imported)}; "
          f"family modules: {family_modules or 'none'}")


if __name__ == "__main__":
    main()
