"""``langchain-ascend`` console script: ``demo`` runs the demo agent, ``info`` the device check,
``doctor`` the environment checks; ``--version`` prints the package version.

Each command owns its options: ``langchain-ascend demo --help`` lists the demo's. A
:class:`~langchain_ascend.errors.LangChainAscendError` a command raises (a missing model, a bad
config file, a missing extra...) is printed as one line on stderr,
``langchain-ascend: error: <message>``, and the exit status is 2 (argparse's for bad usage);
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from langchain_ascend._version import __version__
from langchain_ascend.errors import LangChainAscendError

PROG = "langchain-ascend"
ERROR_EXIT = 2

_COMMANDS = {
    "demo": "run the demo agent (see `langchain-ascend demo --help`)",
    "info": "show which device 'auto' picks and why the others were not",
    "doctor": "check the environment (torch/torch-npu/CANN, devices, memory, kernels); "
              "see `langchain-ascend doctor --help`",
    "serve": "serve a model over an OpenAI-compatible HTTP API (see `langchain-ascend serve "
             "--help`; needs the 'serve' extra)",
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="langchain-ascend",
        description="; ".join(f"{name}: {text}" for name, text in _COMMANDS.items()))
    parser.add_argument("--version", "-V", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("command", choices=sorted(_COMMANDS))
    return parser


def error_line(exc: BaseException) -> str:
    """``langchain-ascend: error: <message>`` on one line (a message's lines joined)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{PROG}: error: {text}"


def _info(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="langchain-ascend info", description=_COMMANDS["info"])
    parser.add_argument("device", nargs="?", default="auto",
                        help="the device string to resolve (default: auto)")
    args = parser.parse_args(argv)
    from langchain_ascend.platform import describe  # not at the top: keeps --version light

    info = describe(args.device)
    print(f"langchain-ascend {__version__}")
    print(f"device: {info.device}  dtype: {info.dtype}  compile backend: {info.compile_backend}")
    print(f"npu: {info.npu_reason or 'available'}")
    print(f"cuda: {info.cuda_reason or 'available'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``langchain-ascend <command> ...``; returns the exit status (module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _COMMANDS:
        # --version / --help print and exit; anything else is a usage error (exit 2)
        _top_parser().parse_args(argv[:1] or ["--help"])
        return ERROR_EXIT
    try:
        return _run(argv[0], argv[1:])
    except LangChainAscendError as exc:
        print(error_line(exc), file=sys.stderr, flush=True)
        return ERROR_EXIT


def option_value(argv: list[str], name: str) -> str | None:
    """The value of option ``name`` in ``argv`` (``name VALUE`` or ``name=VALUE``; the last one
    wins, as with argparse), or None."""
    value = None
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value


def _start_kernel_compiles(rest: list[str]) -> None:
    """Where the command will most likely run on the CPU, start compiling the decode step's C
    kernels now, before its imports: on a first run they compile on a second core meanwhile
    (``native.build``). ``--config`` may name another device: then this is only a guess."""
    from langchain_ascend import platform
    from langchain_ascend.native import build, stack_kernel

    if "-h" in rest or "--help" in rest:
        return
    if platform.probably_cpu(option_value(rest, "--device")):
        build.start_compiles([stack_kernel.KERNEL])


def _run(command: str, rest: list[str]) -> int:
    """Run one command with its own arguments."""
    # Each command's module loads only when it runs, so `--version`, `--help` and `info` stay
    # light (demo loads langchain_core, doctor numpy, serve FastAPI).
    if command == "demo":
        _start_kernel_compiles(rest)
        from langchain_ascend.app.demo import main as demo_main

        return demo_main(rest)
    if command == "doctor":
        from langchain_ascend.app.doctor import main as doctor_main

        return doctor_main(rest)
    if command == "serve":
        _start_kernel_compiles(rest)
        from langchain_ascend.serve.serve_command import main as serve_main

        return serve_main(rest)
    return _info(rest)


if __name__ == "__main__":
    raise SystemExit(main())
