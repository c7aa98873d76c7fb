"""The doctor's checks: each a small pure function of what was measured, returning a
:class:`Finding` (``ok`` / ``warn`` / ``fail`` / ``skip``, what was found, how to fix it), so
tests call them with fake inputs. :mod:`langchain_ascend.app.doctor` measures the machine and
runs them.

The torch / torch-npu / CANN pairs live in :data:`TORCH_NPU_PAIRS` (the same pairs as the
README's "Ascend (NPU) install notes").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from langchain_ascend.cache_dir import NATIVE, cache_subdir
from langchain_ascend.engine.worker.kv_cache import (
    CPU_KV_CACHE_CAP_BYTES,
    DEFAULT_MAX_KV_TOKENS,
    MIN_NUM_BLOCKS,
)

Status = Literal["ok", "warn", "fail", "skip"]

#: torch-npu release -> (the torch it pins, the CANN versions it is built for; empty: not
#: listed). Keep in step with README.md "Ascend (NPU) install notes".
TORCH_NPU_PAIRS: dict[str, tuple[str, tuple[str, ...]]] = {
    "2.9.0": ("2.9.0", ("8.5.0", "9.0.0")),
    "2.12.0": ("2.12.0", ("9.1.0",)),
    "2.14.0": ("2.14.0", ()),
}
#: The transformers range when the installed package metadata cannot be read (pyproject's pin).
TRANSFORMERS_RANGE = ">=5.0,<5.24"
#: The CPU kernels of :mod:`langchain_ascend.native`.
NATIVE_KERNELS = ("paged_attention", "rope_kv", "matvec", "rms_norm", "decode_stack")
#: Allocator keys torch (CUDA) and torch_npu (NPU) read from ``PYTORCH_*_ALLOC_CONF``.
ALLOC_KEYS = {
    "expandable_segments": "bool", "max_split_size_mb": "mb",
    "garbage_collection_threshold": "fraction", "roundup_power2_divisions": "divisions",
    "backend": "backend", "pinned_use_cuda_host_register": "bool",
    "pinned_num_register_threads": "int", "release_lock_on_cudamalloc": "bool",
    "per_process_memory_fraction": "fraction",
}


@dataclass(frozen=True)
class Finding:
    """One check's outcome.

    Attributes:
        name: The check.
        status: ``"ok"``, ``"warn"`` (works, but slower or risky), ``"fail"`` (will not work)
            or ``"skip"`` (does not apply here; ``detail`` says why).
        detail: What was found.
        fix: What to do about it (empty when nothing).
    """

    name: str
    status: Status
    detail: str
    fix: str = ""


def _base(version: str | None) -> str | None:
    """``2.9.0`` of ``2.9.0+cpu`` / ``2.9.0.post4`` / ``2.9.0rc1``."""
    if not version:
        return None
    match = re.match(r"\d+(\.\d+)*", version)
    return match.group(0) if match else version


# --------------------------------------------------------------------------- checks


def check_versions(torch_version: str | None, torch_npu_version: str | None,
                   cann_version: str | None) -> Finding:
    """torch / torch-npu / CANN against :data:`TORCH_NPU_PAIRS` (torch-npu pins torch
    exactly)."""
    name = "torch / torch-npu / CANN"
    if torch_version is None:
        return Finding(name, "fail", "torch is not installed",
                       "pip install torch (then torch-npu of the same version for an NPU)")
    if torch_npu_version is None:
        return Finding(name, "skip", f"torch {torch_version}; torch-npu is not installed, so "
                       "no NPU pairing to check")
    torch_base, npu_base = _base(torch_version), _base(torch_npu_version)
    if torch_base != npu_base:
        return Finding(name, "fail", f"torch {torch_version} with torch-npu {torch_npu_version}: "
                       "torch-npu pins torch exactly",
                       f"pip install torch=={npu_base} (or the torch-npu matching torch "
                       f"{torch_base})")
    pair = TORCH_NPU_PAIRS.get(npu_base or "")
    found = f"torch {torch_version}, torch-npu {torch_npu_version}, CANN {cann_version or '?'}"
    if pair is None:
        known = ", ".join(TORCH_NPU_PAIRS)
        return Finding(name, "warn", f"{found}: torch-npu {npu_base} is not a pair we list "
                       f"({known})", "use a listed torch-npu release, or tell us it works")
    if cann_version is None:
        return Finding(name, "warn", f"{found}: the CANN version could not be read",
                       "source /usr/local/Ascend/ascend-toolkit/set_env.sh (sets "
                       "ASCEND_TOOLKIT_HOME) before running Python")
    wanted = pair[1]
    if wanted and _base(cann_version) not in wanted:
        return Finding(name, "fail", f"{found}: torch-npu {npu_base} is built for CANN "
                       f"{' / '.join(wanted)}",
                       f"install CANN {' or '.join(wanted)}, or the torch-npu built for CANN "
                       f"{cann_version}")
    note = "" if wanted else " (no CANN version listed for this release)"
    return Finding(name, "ok", found + note)


def classify_torch_import(returncode: int, stderr: str) -> Finding:
    """The outcome of ``python -c "import torch"`` in a fresh process (torch auto-loads
    torch_npu through an entry point; without CANN that import fails)."""
    name = "import torch"
    if returncode == 0:
        return Finding(name, "ok", "imports cleanly in a fresh process")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {returncode}"
    if "torch_npu" in stderr and any(s in stderr for s in (
            "Failed to load the backend extension", "libhccl", "libascend", "libacl", ".so")):
        return Finding(name, "fail", "torch auto-loads torch_npu and that fails: the CANN "
                       f"libraries are not found ({last})",
                       "source /usr/local/Ascend/ascend-toolkit/set_env.sh; or set "
                       "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to use torch without the NPU; or pip "
                       "uninstall torch-npu on a machine without an NPU")
    if "No module named 'torch'" in stderr:
        return Finding(name, "fail", "torch is not installed", "pip install torch")
    return Finding(name, "fail", f"import torch fails: {last}",
                   "reinstall torch (pip install --force-reinstall torch)")


_DEVICE_LIST = re.compile(r"^\s*(\d+|GPU-[\w-]+|MIG-[\w/-]+)(\s*,\s*(\d+|GPU-[\w-]+|MIG-[\w/-]+))*\s*$")


def check_visible_devices(*, npu_count: int, npu_reason: str, cuda_count: int,
                          cuda_reason: str, chosen: str, env: Mapping[str, str]) -> Finding:
    """Which accelerators are visible, what ``"auto"`` picks, and whether
    ``ASCEND_RT_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` hide them or are malformed."""
    name = "visible devices"
    parts = [f"NPU: {npu_count}" if npu_count else f"NPU: none ({npu_reason})",
             f"CUDA: {cuda_count}" if cuda_count else f"CUDA: none ({cuda_reason})",
             "CPU: yes", f"auto picks {chosen}"]
    problems, fixes = [], []
    for var, count, kind in (("ASCEND_RT_VISIBLE_DEVICES", npu_count, "NPU"),
                             ("CUDA_VISIBLE_DEVICES", cuda_count, "CUDA")):
        value = env.get(var)
        if value is None:
            continue
        parts.append(f"{var}={value!r}")
        if value.strip() in ("", "-1"):
            problems.append(f"{var}={value!r} hides every {kind} device")
            fixes.append(f"unset {var} or list device ids (e.g. {var}=0)")
        elif not _DEVICE_LIST.match(value):
            problems.append(f"{var}={value!r} is not a comma-separated list of device ids")
            fixes.append(f"set {var} to ids like 0,1")
        elif count == 0 and kind == "NPU" and "not installed" not in npu_reason:
            problems.append(f"{var} is set but no NPU is visible")
            fixes.append("check npu-smi info and the ids in " + var)
    detail = "; ".join(parts + problems)
    if problems:
        return Finding(name, "warn", detail, "; ".join(fixes))
    return Finding(name, "ok", detail)


def check_bf16(device_type: str, bf16_supported: bool | None) -> Finding:
    """Whether the chosen accelerator runs bfloat16 (``dtype="auto"`` picks it when it does)."""
    name = "bf16"
    if device_type == "cpu":
        return Finding(name, "skip", "on the CPU dtype='auto' is float32 (bf16 would run, "
                       "slower on most CPUs)")
    if bf16_supported is None:
        return Finding(name, "warn", f"could not ask {device_type} whether it supports bf16",
                       "pass dtype='float16' explicitly")
    if bf16_supported:
        return Finding(name, "ok", f"{device_type} supports bfloat16 (dtype='auto' uses it)")
    older = "910A" if device_type == "npu" else "pre-Ampere GPUs"
    return Finding(name, "warn", f"{device_type} has no bfloat16 ({older}); dtype='auto' uses "
                   "float16", "keep dtype='auto' or 'float16'; a bf16 model is cast")


def _alloc_value_problem(kind: str, key: str, value: str) -> str | None:
    if kind == "bool":
        return None if value in ("True", "False", "true", "false", "1", "0") else \
            f"{key} must be True or False"
    if kind in ("mb", "int"):
        if not value.isdigit():
            return f"{key} must be a whole number"
        if kind == "mb" and int(value) <= 20:
            return f"{key} must be above 20 (MB)"
        return None
    if kind == "fraction":
        try:
            number = float(value)
        except ValueError:
            return f"{key} must be a number in (0, 1)"
        return None if 0 < number < 1 else f"{key} must be in (0, 1)"
    if kind == "divisions":
        ok = value.isdigit() or re.fullmatch(r"\[[\d\s:>,]+\]", value) is not None
        return None if ok else f"{key} must be a power of two or a [size:divisions,...] list"
    if kind == "backend":
        return None if value in ("native", "cudaMallocAsync") else \
            f"{key} must be native or cudaMallocAsync"
    return None


def check_alloc_conf(env: Mapping[str, str], device_type: str) -> Finding:
    """``PYTORCH_NPU_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` parsed and sanity-checked
    (a malformed entry makes the first device allocation raise)."""
    name = "allocator settings"
    wanted = {"npu": "PYTORCH_NPU_ALLOC_CONF", "cuda": "PYTORCH_CUDA_ALLOC_CONF"}.get(device_type)
    found, errors, warnings = [], [], []
    for var in ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        value = env.get(var)
        if value is None:
            continue
        found.append(f"{var}={value!r}")
        for entry in (e.strip() for e in re.split(r",(?![^\[]*\])", value) if e.strip()):
            key, sep, setting = entry.partition(":")
            key, setting = key.strip(), setting.strip()
            if not sep or not setting:
                errors.append(f"{var}: {entry!r} is not key:value")
            elif key not in ALLOC_KEYS:
                warnings.append(f"{var}: unknown key {key!r}")
            elif (problem := _alloc_value_problem(ALLOC_KEYS[key], key, setting)) is not None:
                errors.append(f"{var}: {problem} (got {setting!r})")
            elif key == "backend" and var == "PYTORCH_NPU_ALLOC_CONF":
                warnings.append(f"{var}: 'backend' is a CUDA setting")
        if wanted is not None and var != wanted and wanted not in env:
            warnings.append(f"{var} is set but the device is {device_type}, which reads {wanted}")
    if not found:
        return Finding(name, "ok", "no PYTORCH_*_ALLOC_CONF set: the allocator's defaults")
    detail = "; ".join(found + errors + warnings)
    if errors:
        return Finding(name, "fail", detail, "fix the entries named (format "
                       "key:value,key:value, e.g. expandable_segments:True)")
    if warnings:
        return Finding(name, "warn", detail, "check the spelling of the keys, and set the "
                       "variable of the device you use")
    return Finding(name, "ok", detail)


def check_kv_pool(*, device: str, free_bytes: int, total_bytes: int, memory_fraction: float,
                  num_blocks: int | None = None, bytes_per_block: int | None = None,
                  block_size: int | None = None, model_context: int | None = None,
                  max_batch_size: int = 64) -> Finding:
    """Free device memory (host RAM on CPU) against the KV pool the engine would allocate
    (``engine.worker.kv_cache.plan_num_blocks``'s rules: ``memory_fraction`` of free memory,
    at most 2 GiB on CPU, room for ``max_batch_size`` full contexts and at most 256k tokens;
    or ``num_blocks`` when given)."""
    name = "KV pool vs free memory"
    gib = 2**30
    memory = f"{device}: {free_bytes / gib:.1f} of {total_bytes / gib:.1f} GiB free"
    if not 0 < memory_fraction <= 1:
        return Finding(name, "fail", f"kv_cache_memory_fraction={memory_fraction} is not in "
                       "(0, 1]", "use a fraction such as 0.5")
    budget = int(free_bytes * memory_fraction)
    if device.startswith("cpu"):
        budget = min(budget, CPU_KV_CACHE_CAP_BYTES)
    if bytes_per_block is None:
        return Finding(name, "ok" if budget >= 256 * 2**20 else "warn",
                       f"{memory}; the default pool may take {budget / gib:.2f} GiB "
                       f"(kv_cache_memory_fraction={memory_fraction}); pass --model to size it",
                       "" if budget >= 256 * 2**20 else "free device memory, or raise "
                       "kv_cache_memory_fraction")
    if num_blocks is not None:
        need = num_blocks * bytes_per_block
        detail = f"{memory}; num_kv_blocks={num_blocks} needs {need / gib:.2f} GiB"
        if need > free_bytes:
            return Finding(name, "fail", detail, "lower num_kv_blocks or free device memory")
        if need > 0.9 * free_bytes:
            return Finding(name, "warn", detail + " (over 90% of free memory: little left "
                           "for activations)", "lower num_kv_blocks")
        return Finding(name, "ok", detail)
    planned = budget // bytes_per_block
    if planned < MIN_NUM_BLOCKS:
        return Finding(name, "fail", f"{memory}; {budget} bytes allowed, one block needs "
                       f"{bytes_per_block}", "free device memory or raise "
                       "kv_cache_memory_fraction")
    size = block_size or 1
    wanted_tokens = min(DEFAULT_MAX_KV_TOKENS,
                        max_batch_size * (model_context or DEFAULT_MAX_KV_TOKENS))
    blocks = min(planned, max(MIN_NUM_BLOCKS, -(-wanted_tokens // size)))
    tokens = blocks * size
    detail = (f"{memory}; the default pool is {blocks} blocks ({tokens} tokens, "
              f"{blocks * bytes_per_block / gib:.2f} GiB; memory allows {planned} blocks)")
    if model_context and tokens < model_context:
        return Finding(name, "warn", detail + f", under one full context ({model_context})",
                       "lower max_context_length or raise kv_cache_memory_fraction")
    return Finding(name, "ok", detail)


def check_transformers(version: str | None, spec: str = TRANSFORMERS_RANGE) -> Finding:
    """transformers inside the tested range (the attention registry we plug into moves
    between releases)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    name = "transformers"
    if version is None:
        return Finding(name, "fail", "transformers is not installed",
                       f"pip install 'transformers{spec}'")
    try:
        inside = Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return Finding(name, "warn", f"transformers {version}: unreadable version",
                       f"pip install 'transformers{spec}'")
    if inside:
        return Finding(name, "ok", f"transformers {version} (tested range {spec})")
    return Finding(name, "warn", f"transformers {version} is outside the tested range {spec}",
                   f"pip install 'transformers{spec}'")


def check_native(host_problem: str | None, results: Mapping[str, str | None]) -> Finding:
    """Whether the CPU decode kernels built (``results``: kernel -> None when loaded, else
    why not); ``host_problem`` is ``native.build.host_problem()``."""
    name = "CPU native kernels"
    if host_problem is not None:
        if "disabled by" in host_problem:
            return Finding(name, "warn", f"not used: {host_problem}; the torch path runs",
                           "unset LANGCHAIN_ASCEND_NATIVE to use them")
        if "compiler" in host_problem:
            return Finding(name, "warn", f"not built: {host_problem}; the torch path runs",
                           "install a C compiler (apt-get install gcc) or set CC")
        return Finding(name, "skip", f"cannot run here: {host_problem}; the torch path runs")
    failed = {k: v for k, v in results.items() if v is not None}
    if failed:
        detail = "; ".join(f"{k}: {v}" for k, v in failed.items())
        return Finding(name, "warn", f"the torch path runs for {', '.join(failed)}: {detail}",
                       f"see the build error above; delete "
                       f"{cache_subdir(NATIVE, override_env='LANGCHAIN_ASCEND_NATIVE_CACHE')} "
                       "to rebuild")
    return Finding(name, "ok", f"built and loaded: {', '.join(results)}")


def check_compile(*, device_type: str, plan: str, compile_backend: str | None,
                  has_graph_api: bool, env: Mapping[str, str]) -> Finding:
    """What runs the decode step with ``compile="auto"`` (``engine.worker.compile.resolve_plan``)
    and why."""
    name = "graph capture / compile"
    if device_type == "cpu":
        compiled = ("compile=True compiles the static step with " + compile_backend
                    if compile_backend is not None
                    else "no C++ compiler for inductor, so compile=True runs eager too")
        return Finding(name, "ok", f"plan {plan}: compile='auto' runs decode steps eagerly on "
                       f"the CPU (the owned model's native decode stack); {compiled}")
    if plan == "graphs":
        if device_type == "npu" and env.get("ASCEND_LAUNCH_BLOCKING") == "1":
            return Finding(name, "warn", "decode steps are captured as NPU graphs, but "
                           "ASCEND_LAUNCH_BLOCKING=1 breaks capture", "unset ASCEND_LAUNCH_BLOCKING")
        kind = "ACLGraph (torch.npu.NPUGraph)" if device_type == "npu" else "CUDA graphs"
        return Finding(name, "ok", f"plan graphs: decode steps captured with {kind} per "
                       "batch-size bucket")
    if not has_graph_api:
        return Finding(name, "warn", f"plan {plan}: this torch build has no graph capture on "
                       f"{device_type}; decode steps run eager", "upgrade torch / torch-npu")
    return Finding(name, "ok", f"plan {plan}")
