"""Command line: ``python -m langchain_ascend.testing build --preset tiny --arch qwen2``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from langchain_ascend.cache_dir import CACHE_ENV_VAR, MODELS, cache_subdir
from langchain_ascend.testing.minilm import minilm_path
from langchain_ascend.testing.model_builder import ALL_ARCHITECTURES, PRESETS, build_model
from langchain_ascend.testing.tokenizer_builder import DEFAULT_VOCAB_SIZE, build_tokenizer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m langchain_ascend.testing",
        description="Build (once, cached) the offline test tokenizers and models.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cache_help = (f"cache folder (default: models/ of the cache root, here "
                  f"{cache_subdir(MODELS)}; ${CACHE_ENV_VAR} moves the root)")

    build = commands.add_parser("build", help="build a model folder and print its path")
    build.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    build.add_argument("--arch", default="qwen2", choices=ALL_ARCHITECTURES)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--cache-dir", default=None, help=cache_help)

    tokenizer = commands.add_parser("tokenizer", help="build a tokenizer and print its path")
    tokenizer.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    tokenizer.add_argument("--cache-dir", default=None, help=cache_help)

    commands.add_parser("minilm", help="print the bundled MiniLM model folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; print the resulting folder on stdout. Returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "build":
        path = build_model(args.preset, args.arch, seed=args.seed, cache_dir=args.cache_dir)
    elif args.command == "tokenizer":
        path = build_tokenizer(args.vocab_size, cache_dir=args.cache_dir)
    else:
        path = minilm_path()
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
