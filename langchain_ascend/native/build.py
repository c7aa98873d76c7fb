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
``rms_norm.c``, ``rope_kv.c``, ``paged_attention.c`` and ``qmatmul.c``) is loaded from that one's library (:func:`provider`): the same code, compiled
once instead of twice, and the per-op path then runs the very machine code the decode stack
runs. Where the including library does
not build, the kernel's own source is built instead.

A build is two steps: compiling the source into an object file (seconds of CPU; it needs
neither torch nor its OpenMP runtime, so its cached name hashes only the sources, the compiler
and the flags) and linking that against torch's libgomp (a fraction of a second). A caller
that knows it will run on the CPU starts the compiles it needs before importing torch
(:func:`start_compiles`: the demo's command line does, so they run on the second core while
the first imports), or whole builds once torch is loaded (:func:`prebuild`); :func:`load`
waits for a compile or build in flight instead of starting its own, and builds only the
library it was asked for.
"""

# Kept over torch.utils.cpp_extension (issue 28): plain C built by cc against torch's own
# libgomp in seconds, no ninja or torch C++ headers, loaded with ctypes under any torch version.
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import functools
import glob
import hashlib
import importlib.util
import logging
import os
import platform as host_platform
import re
import shutil
import signal
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
"""Object or library file -> its compile or build, in flight or done, in this process."""
_compilers: dict[subprocess.Popen[str], Path] = {}
"""Compiler or linker processes running now -> their temporary folders."""
_fallback_dirs: list[Path] = []
"""The temporary build folder of this process, once the cache proved not writable."""


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
    return _first_problem(with_openmp=True)


def compile_problem() -> str | None:
    """Why the kernels cannot be compiled here, or None: :func:`host_problem` without the
    OpenMP check, so it needs no torch import."""
    return _first_problem(with_openmp=False)


def _first_problem(*, with_openmp: bool) -> str | None:
    if os.environ.get(DISABLE_ENV_VAR, "1").strip() == "0":
        return f"disabled by {DISABLE_ENV_VAR}=0"
    if sys.platform != "linux" or host_platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs Linux on x86-64, this is {sys.platform} on {host_platform.machine()}"
    missing = REQUIRED_CPU_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    if with_openmp and openmp_runtime() is None:
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
    return f"{name}-{_digest(source, compiler_path, openmp_path)}.so"


def object_name(name: str, source: bytes, compiler_path: str) -> str:
    """File name of a compiled object: ``<name>-<hash of source, compiler and flags>.o`` (no
    OpenMP runtime: only the link names it)."""
    return f"{name}-{_digest(source, compiler_path)}.o"


def _digest(source: bytes, compiler_path: str, openmp_path: str | None = None) -> str:
    """16 hex digits of the source, the compiler, the flags and (for a library) the OpenMP
    runtime, in that order (a library's name is the same as before objects existed)."""
    digest = hashlib.sha256()
    parts = [source, compiler_path.encode(), " ".join(COMPILE_FLAGS).encode()]
    for part in parts + ([openmp_path.encode()] if openmp_path is not None else []):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def source_bytes(source_path: Path) -> bytes:
    """What a build of ``source_path`` depends on: its text, the sources it includes from this
    folder (``#include "other.c"``, one level: a kernel built from others) and the folder's
    headers."""
    text = source_path.read_bytes()
    included = re.findall(rb'^#include "([A-Za-z0-9_]+\.c)"', text, flags=re.MULTILINE)
    return text + b"".join((SOURCE_DIR / name.decode()).read_bytes() for name in included) + (
        b"".join(header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h"))))


def cache_dir() -> Path:
    """A writable folder for builds (see the module docstring); the same temporary folder for
    the whole process where the cache is not writable."""
    folder = cache_subdir(NATIVE, override_env=CACHE_ENV_VAR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    with _builds_lock:
        if not _fallback_dirs:
            _fallback_dirs.append(Path(tempfile.mkdtemp(prefix="langchain_ascend_native_")))
        return _fallback_dirs[0]


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


def start_compiles(names: Sequence[str] | None = None) -> list[str]:
    """Start compiling, each in a background thread, the objects of the libraries ``names``
    (default: every kernel) are loaded from that are not compiled yet; returns those started
    or in flight. Imports no torch: a caller that will run on the CPU may call it first thing.

    Nothing starts where the kernels cannot be compiled here (:func:`compile_problem`).
    """
    if compile_problem() is not None:
        return []
    return _in_flight(_start_compile_unless_built, names)


def prebuild(names: Sequence[str] | None = None) -> list[str]:
    """Start building (compile where not compiled yet, then link), each in a background
    thread, the libraries ``names`` (default: every kernel) are loaded from that are not built
    yet; returns those started or in flight.

    Nothing starts where the kernels cannot run here (:func:`host_problem`). :func:`load`
    waits for a build in flight instead of starting its own.
    """
    if host_problem() is not None:
        return []
    return _in_flight(_start_build, names)


def wait_for_builds() -> None:
    """Wait for every compile and build this process started (failures are left for
    :func:`load` to report)."""
    with _builds_lock:
        jobs = list(_builds.values())
    concurrent.futures.wait(jobs)


def jobs_in_flight() -> list[str]:
    """The files (``decode_stack-<hash>.o``...) this process is compiling or building now."""
    with _builds_lock:
        return sorted(target.name for target, job in _builds.items() if not job.done())


def _in_flight(start: Any, names: Sequence[str] | None) -> list[str]:
    """Run ``start(kernel)`` for each library ``names`` are loaded from; the kernels whose job
    is still running."""
    started = []
    for kernel in dict.fromkeys(provider(name) for name in (names or kernel_names())):
        _, job = start(kernel)
        if job is not None and not job.done():
            started.append(kernel)
    return started


def _start_compile(name: str) -> tuple[Path, concurrent.futures.Future[None] | None]:
    """Kernel ``name``'s object file, and its compile (as :func:`_start_job`)."""
    source_path, compiler_path = SOURCE_DIR / f"{name}.c", compiler()
    assert compiler_path is not None  # compile_problem checked it
    target = cache_dir() / object_name(name, source_bytes(source_path), compiler_path)
    return _start_job(target, f"compile-{name}",
                      lambda: _compile_object(compiler_path, source_path, target))


def _start_compile_unless_built(name: str,
                                ) -> tuple[Path, concurrent.futures.Future[None] | None]:
    """:func:`_start_compile`, unless the library is already built against the libgomp in
    torch's folder (found without importing torch; a cache older than object files has only
    libraries)."""
    source_path, compiler_path = SOURCE_DIR / f"{name}.c", compiler()
    spec = importlib.util.find_spec("torch")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    runtimes = [os.path.realpath(found) for folder in folders
                for found in glob.glob(os.path.join(folder, "lib", "libgomp*.so*"))]
    if len(runtimes) == 1 and compiler_path is not None:
        library = cache_dir() / library_name(name, source_bytes(source_path), compiler_path,
                                             runtimes[0])
        if library.exists():
            return library, None
    return _start_compile(name)


def _start_build(name: str) -> tuple[Path, concurrent.futures.Future[None] | None]:
    """Kernel ``name``'s library file, and its build (as :func:`_start_job`): its object's
    compile (started, or joined when in flight), then the link."""
    source_path = SOURCE_DIR / f"{name}.c"
    openmp_path, compiler_path = openmp_runtime(), compiler()
    assert openmp_path is not None and compiler_path is not None  # host_problem checked both
    target = cache_dir() / library_name(name, source_bytes(source_path), compiler_path,
                                        openmp_path)

    def build() -> None:
        obj, compiling = _start_compile(name)
        if compiling is not None:
            compiling.result()
        _link(compiler_path, obj, openmp_path, target)

    return _start_job(target, f"build-{name}", build)


def _start_job(target: Path, thread_name: str, work: Any,
               ) -> tuple[Path, concurrent.futures.Future[None] | None]:
    """``target``, and the job making it: None when the file is already there, else the job in
    flight (``work()`` started here, in a daemon thread, when none is). A job that fails
    leaves the table, so a later call tries again."""
    with _builds_lock:
        job = _builds.get(target)
        if job is not None or target.exists():
            return target, job
        _builds[target] = job = concurrent.futures.Future()

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            with _builds_lock:
                if _builds.get(target) is job:
                    del _builds[target]
            job.set_exception(exc)
        else:
            job.set_result(None)

    threading.Thread(target=run, name=thread_name, daemon=True).start()
    return target, job


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
    if build is not None:
        try:
            build.result()
        except (OSError, subprocess.SubprocessError) as exc:
            return NativeLibrary(None, f"build failed: {exc}")
    before = mapped_openmp_libraries()
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return NativeLibrary(None, f"loading {target} failed: {exc}")
    if mapped_openmp_libraries() != before:  # it pulled in a second runtime: never call it
        return NativeLibrary(None, f"{target} loaded a second OpenMP runtime")
    return NativeLibrary(lib, f"loaded {target}")


def _compile_object(compiler_path: str, source: Path, target: Path) -> None:
    """Compile ``source`` into the object file ``target`` (atomically)."""
    # -pipe: no assembly file in $TMPDIR, which a compile stopped at exit would leave behind.
    _run_into(target, [compiler_path, *COMPILE_FLAGS, "-pipe", f"-I{SOURCE_DIR}", "-c",
                       str(source)])


def _link(compiler_path: str, obj: Path, openmp_path: str, target: Path) -> None:
    """Link ``obj`` against ``openmp_path`` into the library ``target`` (atomically); the OpenMP
    runtime is named by file (not -fopenmp, which would link the system's)."""
    _run_into(target, [compiler_path, "-shared", str(obj), openmp_path, "-lm"])


def _run_into(target: Path, command: list[str]) -> None:
    """Run ``command -o <temporary file>`` and rename that file to ``target``: concurrent
    processes never see half a file. A compiler still running when this process exits is
    stopped and its temporary folder removed (:func:`_stop_compilers`)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        written = Path(work) / target.name
        command = [*command, "-o", str(written)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)  # its own group: cc1 too
        with _builds_lock:
            _compilers[process] = Path(work)
        try:
            _, stderr = process.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(process)
            process.communicate()
            raise
        finally:
            with _builds_lock:
                _compilers.pop(process, None)
        if process.returncode:
            raise subprocess.SubprocessError(
                f"{' '.join(command)} exited {process.returncode}: {stderr.strip()[-2000:]}")
        os.replace(written, target)


@atexit.register
def _stop_compilers() -> None:
    """At exit (a command that failed early, a test process): stop the compilers the daemon
    build threads started, which would otherwise leave their temporary folders behind."""
    with _builds_lock:
        running = list(_compilers.items())
    for process, work in running:
        _kill(process)
        process.wait()
        shutil.rmtree(work, ignore_errors=True)


def _kill(process: subprocess.Popen[str]) -> None:
    """Kill a compiler and the programs it started (cc1, as: its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
