"""``langchain-ascend`` console script: ``demo`` runs the demo agent, ``info`` the device check."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="langchain-ascend")
    parser.add_argument("command", choices=["demo", "info"], help="demo: run the demo agent; "
                        "info: show which device 'auto' picks and why")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from langchain_ascend.app.demo import main as demo_main

        return demo_main(rest)
    from langchain_ascend import __version__
    from langchain_ascend.platform import describe

    info = describe(rest[0] if rest else "auto")
    print(f"langchain-ascend {__version__}")
    print(f"device: {info.device}  dtype: {info.dtype}  compile backend: {info.compile_backend}")
    print(f"npu: {info.npu_reason or 'available'}")
    print(f"cuda: {info.cuda_reason or 'available'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
