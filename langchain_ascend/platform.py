"""The one place that knows about npu / cuda / cpu.

Everything device-specific in the package asks this module: which device ``"auto"`` means,
whether an explicit request can be honoured, streams and events, synchronisation, memory
figures, the default dtype and which ``torch.compile`` backend applies.

``torch_npu`` is imported only here (and in ``attention/backends/npu.py``), lazily and guarded:
since torch 2.5 torch auto-loads torch_npu through an entry point, and with torch_npu installed
but CANN missing a plain ``import torch`` fails. When we only *probe*, we import torch with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` and then try ``import torch_npu`` ourselves, turning any
failure into a reason string. An explicit ``device="npu"`` with a broken install raises
:class:`~langchain_ascend.errors.DeviceUnavailableError` naming what is missing; it never falls
back to the CPU silently.

NPU parts are written from the torch_npu sources and docs (see ASCEND_API.md) and are untested
on hardware.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_ascend.errors import DeviceUnavailableError, InvalidRequestError

if TYPE_CHECKING:
    import torch

DeviceType = Literal["npu", "cuda", "cpu"]
_KNOWN_TYPES = ("npu", "cuda", "cpu")


def import_torch() -> Any:
    """Import torch without letting a broken torch_npu entry point break the import."""
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch

    return torch


@dataclass(frozen=True)
class NPUProbe:
    """Outcome of trying to use an Ascend NPU.

    Attributes:
        available: True when torch_npu imported and reports at least one device.
        reason: Why not, in words a user can act on (empty when available).
        device_count: Number of visible NPUs.
    """

    available: bool
    reason: str
    device_count: int = 0


@functools.lru_cache(maxsize=1)
def probe_npu() -> NPUProbe:
    """Try ``import torch_npu`` and ask it for devices; never raises."""
    if importlib.util.find_spec("torch_npu") is None:
        return NPUProbe(False, "torch_npu is not installed (pip install 'langchain-ascend[npu]', "
                               "plus the CANN toolkit)")
    torch = import_torch()
    try:
        importlib.import_module("torch_npu")
    except Exception as exc:  # noqa: BLE001 - any failure is a reason, not a crash
        text = f"{type(exc).__name__}: {exc}"
        if any(lib in text for lib in ("libhccl", "libascend", "libacl", ".so", "CANN")):
            return NPUProbe(False, "torch_npu is installed but the CANN libraries were not found "
                                   f"(source set_env.sh from the CANN toolkit): {text}")
        return NPUProbe(False, f"torch_npu failed to import: {text}")
    npu = getattr(torch, "npu", None)
    try:
        count = int(npu.device_count()) if npu is not None and npu.is_available() else 0
    except Exception as exc:  # noqa: BLE001
        return NPUProbe(False, f"torch_npu imported but querying devices failed: {exc}")
    if count == 0:
        return NPUProbe(False, "torch_npu imported but reports no NPU device "
                               "(check ASCEND_RT_VISIBLE_DEVICES and npu-smi)")
    return NPUProbe(True, "", count)


def import_torch_npu(purpose: str) -> Any:
    """``import torch_npu`` for ``purpose`` (e.g. "the NPU attention backend"), or raise
    :class:`~langchain_ascend.errors.DeviceUnavailableError` saying why."""
    try:
        return importlib.import_module("torch_npu")
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable torch_npu"
        raise DeviceUnavailableError(
            f"{purpose} needs torch_npu with the CANN toolkit "
            f"(pip install 'langchain-ascend[npu]'; source CANN's set_env.sh): {exc}") from exc


def cuda_reason() -> str:
    """Why CUDA cannot be used, or an empty string when it can."""
    torch = import_torch()
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return "this torch build has no CUDA support (a CPU build is installed)"
        return "torch has CUDA support but no CUDA device is visible"
    return ""


def probably_cpu(device: str | None) -> bool:
    """Without importing torch: whether ``device`` most likely resolves to the CPU -- ``"cpu"``,
    or ``"auto"`` where torch_npu is not installed and no NVIDIA device node exists. A guess
    for starting CPU-only work early (the C kernels' compiles): a wrong one costs that work,
    never a result; :func:`resolve_device` still decides."""
    text = (device or "auto").strip().lower()
    if text == "cpu":
        return True
    return (text == "auto" and importlib.util.find_spec("torch_npu") is None
            and not os.path.exists("/dev/nvidia0"))


def _parse(device: str) -> tuple[str, int | None]:
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if kind not in _KNOWN_TYPES and kind != "auto":
        raise DeviceUnavailableError(
            f"unknown device {device!r}: use 'auto', 'npu', 'npu:N', 'cuda', 'cuda:N' or 'cpu'")
    if index:
        if not index.isdigit():
            raise DeviceUnavailableError(f"bad device index in {device!r}")
        if kind == "cpu" and int(index) != 0:
            raise DeviceUnavailableError(f"device {device!r}: the CPU has no index; use 'cpu'")
        return kind, int(index)
    return kind, None


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Turn a user's device choice into a usable ``torch.device``.

    Args:
        device: ``"auto"`` (NPU if torch_npu works, else CUDA, else CPU), ``"npu"``,
            ``"npu:1"``, ``"cuda"``, ``"cuda:0"``, ``"cpu"`` or a ``torch.device``.

    Returns:
        The resolved device, with an index for accelerators.

    Raises:
        DeviceUnavailableError: An explicit accelerator cannot be used; the message says why.
    """
    torch = import_torch()
    if device is None:
        device = "auto"
    kind, index = _parse(str(device))
    if kind == "auto":
        if probe_npu().available:
            kind = "npu"
        elif not cuda_reason():
            kind = "cuda"
        else:
            return torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        probe = probe_npu()
        if not probe.available:
            raise DeviceUnavailableError(f"device {device!r} requested but {probe.reason}")
        count = probe.device_count
    else:
        reason = cuda_reason()
        if reason:
            raise DeviceUnavailableError(f"device {device!r} requested but {reason}")
        count = torch.cuda.device_count()
    index = 0 if index is None else index
    if index >= count:
        raise DeviceUnavailableError(
            f"device {device!r} requested but only {count} {kind} device(s) are visible")
    return _make_device(kind, index)


def _make_device(kind: str, index: int) -> torch.device:
    """``torch.device(kind, index)``; "npu" is only a valid type once torch_npu is imported."""
    torch = import_torch()
    return torch.device(kind, index)


def device_type(device: torch.device | str) -> str:
    """``"npu"``, ``"cuda"`` or ``"cpu"`` for a device or device string."""
    return str(device).split(":")[0]


def callers_drive_steps(device: Any) -> bool:
    """Whether a thread blocked on its own request runs the engine's steps itself (the CPU)
    rather than leaving them to the engine's loop thread (accelerators).

    On the CPU torch's kernels run on a per-thread OpenMP pool; more pool threads than cores
    make every pool sleep between parallel regions, so the steps run on the caller's pool.
    ``device`` is a ``torch.device`` (anything with a ``type``).
    """
    return getattr(device, "type", None) == "cpu"


CPU_PREFILL_BESIDE_DECODES = 256
"""Most prefill tokens a CPU step with decode rows computes: a 2,048-token step of SmolLM2-135M
is ~2 s on 2 cores, and every stream decoding beside it waits that long for its next token;
256-token chunks prefill a 2k-token prompt within a few per cent of 2,048-token ones
(``docs/performance.md``)."""


def prefill_beside_decodes(device: Any) -> int | None:
    """The scheduler's ``prefill_beside_decodes`` on ``device`` (a ``torch.device``):
    :data:`CPU_PREFILL_BESIDE_DECODES` on the CPU, None (the whole step budget) on
    accelerators, whose steps take milliseconds."""
    return CPU_PREFILL_BESIDE_DECODES if getattr(device, "type", None) == "cpu" else None


CPU_ATTENTION_SLOWDOWN = 3.0
"""How much slower a multiply-add of attention runs than one of the linear layers on the CPU
(float32 FMAs against int8 products; ``docs/performance.md``)."""


def prefill_attention_slowdown(device: Any) -> float | None:
    """Where the scheduler charges prefill beside decodes by its attention too (the CPU:
    :data:`CPU_ATTENTION_SLOWDOWN`), else None (accelerators: the whole budget, by tokens)."""
    return CPU_ATTENTION_SLOWDOWN if getattr(device, "type", None) == "cpu" else None


def _backend_module(device: torch.device) -> Any:
    torch = import_torch()
    kind = device_type(device)
    if kind == "npu":
        return torch.npu  # registered by torch_npu, imported by probe_npu()
    if kind == "cuda":
        return torch.cuda
    return None


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators that support it (910B / Ampere+), fp16 on older ones, fp32 on CPU."""
    torch = import_torch()
    mod = _backend_module(device)
    if mod is None:
        return torch.float32
    try:
        return torch.bfloat16 if mod.is_bf16_supported() else torch.float16
    except Exception:  # noqa: BLE001
        return torch.float16


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Map ``"auto"`` / ``"bf16"`` / ``"float16"`` / a ``torch.dtype`` to a ``torch.dtype``."""
    torch = import_torch()
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }
    key = str(dtype).lower().removeprefix("torch.")
    if key not in names:
        raise InvalidRequestError(
            f"dtype={dtype!r} is not supported: use auto, float32, bfloat16 or float16")
    return names[key]


def synchronize(device: torch.device) -> None:
    """Wait for all work queued on ``device``; a no-op on CPU."""
    mod = _backend_module(device)
    if mod is not None:
        mod.synchronize(device)


def new_stream(device: torch.device) -> Any:
    """A new side stream on ``device`` (``torch.npu.Stream`` / ``torch.cuda.Stream``); None on CPU."""
    mod = _backend_module(device)
    return None if mod is None else mod.Stream(device=device)


def current_stream(device: torch.device) -> Any:
    """The caller's current stream on ``device``; None on CPU."""
    mod = _backend_module(device)
    return None if mod is None else mod.current_stream(device)


def new_event(device: torch.device) -> Any:
    """A new event on ``device``; None on CPU."""
    mod = _backend_module(device)
    return None if mod is None else mod.Event()


@contextlib.contextmanager
def use_stream(stream: Any) -> Iterator[None]:
    """Make ``stream`` current inside the block; a no-op for ``None`` (CPU)."""
    if stream is None:
        yield
        return
    torch = import_torch()
    kind = device_type(stream.device)
    mod = torch.npu if kind == "npu" else torch.cuda
    with mod.stream(stream):
        yield


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes. On CPU ``free``/``total`` describe host RAM."""

    free: int
    total: int
    allocated: int


def memory_info(device: torch.device) -> MemoryInfo:
    """Free/total/allocated bytes on ``device`` (host RAM figures on CPU)."""
    mod = _backend_module(device)
    if mod is None:
        free, total = _host_memory()
        return MemoryInfo(free=free, total=total, allocated=0)
    free, total = mod.mem_get_info(device)
    return MemoryInfo(free=int(free), total=int(total), allocated=int(mod.memory_allocated(device)))


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host RAM, on every OS (psutil; Linux: MemAvailable)."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def compile_backend(device: torch.device) -> str | None:
    """The ``torch.compile`` backend for a decode step on ``device``.

    NPU: ``"npugraph_ex"`` (ACLGraph capture + FX passes, recommended by torch_npu for LLM
    inference; there is no ``"ascend"`` backend). CUDA: ``"inductor"``. CPU: ``"inductor"``
    when a C++ compiler is present, else ``None`` (run eager).
    """
    kind = device_type(device)
    if kind == "npu":
        return "npugraph_ex"
    if kind == "cuda":
        return "inductor"
    import shutil

    return "inductor" if (shutil.which("g++") or shutil.which("c++")) else None


@dataclass(frozen=True)
class PlatformInfo:
    """A summary for logs and the demo's banner."""

    device: str
    dtype: str
    compile_backend: str | None
    npu_reason: str
    cuda_reason: str


def describe(device: str | torch.device = "auto") -> PlatformInfo:
    """What ``device`` resolves to and why the other accelerators were not picked."""
    resolved = resolve_device(device)
    return PlatformInfo(
        device=str(resolved),
        dtype=str(default_dtype(resolved)).removeprefix("torch."),
        compile_backend=compile_backend(resolved),
        npu_reason=probe_npu().reason,
        cuda_reason=cuda_reason(),
    )


@dataclass(frozen=True)
class GraphAPI:
    """What capturing the decode step needs from a device's graph module.

    ``torch.cuda`` (``CUDAGraph``, ``graph``, ``graph_pool_handle``) and ``torch.npu``
    (``NPUGraph``, ``graph``, ``graph_pool_handle``; untested on hardware) have the same shape;
    tests pass a fake.

    Attributes:
        new_graph: Makes an empty graph (``replay()`` runs what it captured).
        graph: ``graph(g, pool=handle)``: the context manager that captures into ``g``.
        pool_handle: A fresh memory-pool handle the captures share.
        synchronize: Waits for the device.
    """

    new_graph: Any
    graph: Any
    pool_handle: Any
    synchronize: Any


def graph_api(device: torch.device) -> GraphAPI | None:
    """The graph-capture API of ``device``: CUDA graphs, Ascend ACLGraph (``torch.npu``),
    None on the CPU or where the installed build lacks it."""
    mod = _backend_module(device)
    if mod is None:
        return None
    names = ("CUDAGraph" if device_type(device) == "cuda" else "NPUGraph", "graph",
             "graph_pool_handle")
    if not all(hasattr(mod, name) for name in names):
        return None
    return GraphAPI(new_graph=getattr(mod, names[0]), graph=mod.graph,
                    pool_handle=mod.graph_pool_handle,
                    synchronize=lambda: mod.synchronize(device))


def pins_memory(device: torch.device) -> bool:
    """Whether host staging for ``device`` should be pinned (page-locked): accelerators only."""
    return _backend_module(device) is not None
