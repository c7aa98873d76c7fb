"""Compile a C kernel shipped in this package once per machine and load it with ctypes.

Only where it is safe, else :func:`load` returns a library of None with the reason and
callers keep their torch path:

* Linux on x86-64 with AVX2, FMA and F16C (the kernels are written with those intrinsics and
  compiled for exactly that, not ``-march=native``, so a cached build never uses more);
* torch runs its CPU kernels on libgomp (OpenMP), already loaded in this process: the kernel
  is linked against THAT file, so its ``#pragma omp`` regions use the same per-thread pools
  as torch's ops. A second OpenMP runtime would add a second pool of busy threads, which on
  a 2-core host slows every op (see ``engine.driver``);
* a C compiler (``$CC``, ``cc``, ``gcc`` or ``clang``) is there;
* ``LANGCHAIN_ASCEND_NATIVE`` is not ``0``.

Builds land in ``$LANGCHAIN_ASCEND_NATIVE_CACHE`` (default ``native/`` of the package's cache
root, :mod:`langchain_ascend.cache_dir`; a temporary folder when that is not writable) under a name hashed from the
source, the shared headers of this folder, the compiler, the flags and the OpenMP library,
written to a temporary name and renamed into place, so concurrent processes never load a
half-written file.

A kernel whose source another one includes (``decode_stack.c`` includes ``matvec.c``,
``rms_norm.c``, ``rope_kv.c``, ``paged_attention.c`` and ``qmatmul.c``) is loaded from that
one's library (:func:`provider`): the same code, compiled once instead of twice, and the per-op
path then runs the very machine code the decode stack runs. Where the including library does
not build, the kernel's own source is built instead. The first build a process needs starts
every other missing one too, each in a thread of its own (:func:`prebuild`; a caller that knows
it will run on the CPU may start them earlier, so they compile while it loads the model): on
a 2-core host the first run's builds take about half the time they took one after another.
"""

# Kept over torch.utils.cpp_extension (issue 28): plain C built by cc against torch's own
# libgomp in seconds, no ninja or torch C++ headers, loaded with ctypes under any torch version.
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import logging
import os
import platform as host_platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_ascend.cache_dir import NATIVE, cache_subdir

logger = logging.getLogger(__name__)

DISABLE_ENV_VAR = "LANGCHAIN_ASCEND_NATIVE"
CACHE_ENV_VAR = "LANGCHAIN_ASCEND_NATIVE_CACHE"
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fno-math-errno", "-fopenmp", "-fPIC")
REQUIRED_CPU_FLAGS = frozenset({"avx2", "fma", "f16c"})
COMPILE_TIMEOUT_S = 120
SOURCE_DIR = Path(__file__).parent


@dataclass(frozen=True)
class NativeLibrary:
    """A loaded kernel library, or None with the reason it is not available.

    Attributes:
        lib: The ``ctypes.CDLL``, or None.
        reason: Where it was loaded from, or why it was not.
    """

    lib: ctypes.CDLL | None
    reason: str


_lock = threading.Lock()
_loaded: dict[str, NativeLibrary] = {}
_functions: dict[tuple[str, str], Any] = {}
_builds_lock = threading.Lock()
_builds: dict[Path, concurrent.futures.Future[None]] = {}
"""Library file -> its build, in flight or done, in this process."""


def load(name: str) -> NativeLibrary:
    """The library built from ``<name>.c`` in this folder (built on first use, then cached)."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = result = _load(name)
            # A host without the kernels is normal (INFO); one that fails to build them is not.
            level = logging.WARNING if result.lib is None and host_problem() is None else logging.INFO
            logger.log(level, "native kernel %r: %s", name, result.reason)
        return _loaded[name]


def function(name: str, symbol: str, argtypes: Sequence[Any], restype: Any = ctypes.c_int) -> Any:
    """``symbol`` of the library built from ``<name>.c``, typed, or None when the library is
    not available here."""
    key = (name, symbol)
    if key in _functions:  # the per-call path: a dict read, no lock (entries are never removed)
        return _functions[key]
    lib = load(name).lib
    fn = None
    if lib is not None:
        fn = getattr(lib, symbol)
        fn.argtypes = list(argtypes)
        fn.restype = restype
    with _lock:
        _functions[key] = fn
    return fn


def host_problem() -> str | None:
    """Why native kernels cannot run in this process, or None when they can."""
    if os.environ.get(DISABLE_ENV_VAR, "1").strip() == "0":
        return f"disabled by {DISABLE_ENV_VAR}=0"
    if sys.platform != "linux" or host_platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs Linux on x86-64, this is {sys.platform} on {host_platform.machine()}"
    missing = REQUIRED_CPU_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    if openmp_runtime() is None:
        return "torch's OpenMP runtime (libgomp) is not loaded in this process"
    if compiler() is None:
        return "no C compiler found (set CC, or install cc/gcc/clang)"
    return None


def cpu_flags() -> set[str]:
    """The CPU feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def mapped_openmp_libraries() -> set[str]:
    """Paths of the libgomp files mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {line.split()[-1] for line in maps.splitlines()
            if "libgomp" in line.rsplit("/", 1)[-1] and line.split()[-1].startswith("/")}


def openmp_runtime() -> str | None:
    """The libgomp torch loaded (importing torch first), or None when torch uses another.

    Other wheels bundle their own libgomp (faiss-cpu does), so the one in torch's folder is
    chosen when several are mapped; with one mapped, that one."""
    import torch

    libraries = sorted(mapped_openmp_libraries())
    torch_dir = str(Path(torch.__file__).resolve().parent) + os.sep
    own = [path for path in libraries if str(Path(path).resolve()).startswith(torch_dir)]
    if len(own) == 1:
        return own[0]
    return libraries[0] if len(libraries) == 1 else None


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else the first of cc, gcc, clang on the PATH."""
    chosen = os.environ.get("CC")
    if chosen:
        return shutil.which(chosen)
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def library_name(name: str, source: bytes, compiler_path: str, openmp_path: str) -> str:
    """File name of a build: ``<name>-<hash of everything that shapes the binary>.so``.

    ``source`` is what the build depends on (:func:`source_bytes`)."""
    digest = hashlib.sha256()
    for part in (source, compiler_path.encode(), " ".join(COMPILE_FLAGS).encode(),
                 openmp_path.encode()):
        digest.update(part)
        digest.update(b"\0")
    return f"{name}-{digest.hexdigest()[:16]}.so"


def source_bytes(source_path: Path) -> bytes:
    """What a build of ``source_path`` depends on: its text, the sources it includes from this
    folder (``#include "other.c"``, one level: a kernel built from others) and the folder's
    headers."""
    text = source_path.read_bytes()
    included = re.findall(rb'^#include "([A-Za-z0-9_]+\.c)"', text, flags=re.MULTILINE)
    return text + b"".join((SOURCE_DIR / name.decode()).read_bytes() for name in included) + (
        b"".join(header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h"))))


def cache_dir() -> Path:
    """A writable folder for builds (see the module docstring)."""
    folder = cache_subdir(NATIVE, override_env=CACHE_ENV_VAR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="langchain_ascend_native_"))


def kernel_names() -> list[str]:
    """Every kernel of this folder: the stems of its ``.c`` files, sorted."""
    return sorted(path.stem for path in SOURCE_DIR.glob("*.c"))


@functools.cache
def included_kernels(name: str) -> frozenset[str]:
    """The kernels ``<name>.c`` includes (``#include "other.c"``)."""
    text = (SOURCE_DIR / f"{name}.c").read_bytes()
    found = re.findall(rb'^#include "([A-Za-z0-9_]+)\.c"', text, flags=re.MULTILINE)
    return frozenset(item.decode() for item in found)


def provider(name: str) -> str:
    """The kernel whose library holds ``name``'s functions: the first kernel (by name) whose
    source includes ``<name>.c``, else ``name`` itself."""
    return next((other for other in kernel_names() if name in included_kernels(other)), name)


def prebuild(names: Sequence[str] | None = None) -> list[str]:
    """Start building, each in a background thread, the libraries ``names`` (default: every
    kernel) are loaded from that are not built yet; returns those started or in flight.

    Nothing starts where the kernels cannot run here (:func:`host_problem`). :func:`load`
    waits for a build in flight instead of starting its own.
    """
    if host_problem() is not None:
        return []
    wanted = dict.fromkeys(provider(name) for name in (names or kernel_names()))
    started = []
    for kernel in wanted:
        _, build = _start_build(kernel)
        if build is not None and not build.done():
            started.append(kernel)
    return started


def _paths(name: str) -> tuple[Path, Path, str, str]:
    """``(source, library file, compiler, OpenMP runtime)`` of kernel ``name``."""
    source_path = SOURCE_DIR / f"{name}.c"
    openmp_path, compiler_path = openmp_runtime(), compiler()
    assert openmp_path is not None and compiler_path is not None  # host_problem checked both
    target = cache_dir() / library_name(name, source_bytes(source_path), compiler_path,
                                        openmp_path)
    return source_path, target, compiler_path, openmp_path


def _start_build(name: str) -> tuple[Path, concurrent.futures.Future[None] | None]:
    """Kernel ``name``'s library file, and its build: None when the file is already there,
    else the build in flight (started here, in a daemon thread, when none is)."""
    source_path, target, compiler_path, openmp_path = _paths(name)
    with _builds_lock:
        build = _builds.get(target)
        if build is not None or target.exists():
            return target, build
        _builds[target] = build = concurrent.futures.Future()

    def run() -> None:
        try:
            _compile(compiler_path, source_path, openmp_path, target)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            build.set_exception(exc)
        else:
            build.set_result(None)

    threading.Thread(target=run, name=f"build-{name}", daemon=True).start()
    return target, build


def _load(name: str) -> NativeLibrary:
    problem = host_problem()
    if problem is not None:
        return NativeLibrary(None, problem)
    kernel = provider(name)
    loaded = _load_kernel(kernel)
    if loaded.lib is None and kernel != name:  # the including source failed: build its own
        logger.warning("native kernel %r: %s; building %s.c alone", kernel, loaded.reason, name)
        loaded = _load_kernel(name)
    return loaded


def _load_kernel(name: str) -> NativeLibrary:
    target, build = _start_build(name)
    if build is not None and not build.done():
        prebuild()  # the first build this process waits for: start the others beside it
    if build is not None:
        try:
            build.result()
        except (OSError, subprocess.SubprocessError) as exc:
            with _builds_lock:  # a later load may try again
                _builds.pop(target, None)
            return NativeLibrary(None, f"build failed: {exc}")
    before = mapped_openmp_libraries()
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return NativeLibrary(None, f"loading {target} failed: {exc}")
    if mapped_openmp_libraries() != before:  # it pulled in a second runtime: never call it
        return NativeLibrary(None, f"{target} loaded a second OpenMP runtime")
    return NativeLibrary(lib, f"loaded {target}")


def _compile(compiler_path: str, source: Path, openmp_path: str, target: Path) -> None:
    """Compile ``source`` and link it against ``openmp_path`` into ``target`` (atomically)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        obj, lib = Path(work) / "kernel.o", Path(work) / target.name
        for command in (
            [compiler_path, *COMPILE_FLAGS, f"-I{SOURCE_DIR}", "-c", str(source), "-o", str(obj)],
            # The OpenMP runtime named by file (not -fopenmp, which would link the system's).
            [compiler_path, "-shared", str(obj), openmp_path, "-lm", "-o", str(lib)],
        ):
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT_S, check=False)
            if done.returncode:
                raise subprocess.SubprocessError(
                    f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        os.replace(lib, target)
