"""``langchain-ascend doctor``: the environment problems Ascend (and CUDA, and CPU) users trip on.

:func:`gather` measures this machine and runs every check of
:mod:`~langchain_ascend.app.doctor_checks` (pure functions of what was measured);
:func:`main` prints the findings (or ``--json``) and exits 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from langchain_ascend import platform
from langchain_ascend.app.doctor_checks import (
    ALLOC_KEYS,
    NATIVE_KERNELS,
    TORCH_NPU_PAIRS,
    TRANSFORMERS_RANGE,
    Finding,
    Status,
    check_alloc_conf,
    check_bf16,
    check_compile,
    check_kv_pool,
    check_native,
    check_transformers,
    check_versions,
    check_visible_devices,
    classify_torch_import,
)
from langchain_ascend.app.doctor_weights import check_model_weights
from langchain_ascend.attention.backends import backend_name_for, get_backend_class
from langchain_ascend.engine import hf_config
from langchain_ascend.engine.worker.compile import resolve_plan
from langchain_ascend.native import build

# The caller's own setting, read before platform imports torch with autoload off.
_ORIGINAL_AUTOLOAD = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")

__all__ = [
    "ALLOC_KEYS",
    "NATIVE_KERNELS",
    "TORCH_NPU_PAIRS",
    "TRANSFORMERS_RANGE",
    "Finding",
    "Status",
    "cann_version",
    "check_alloc_conf",
    "check_bf16",
    "check_compile",
    "check_kv_pool",
    "check_native",
    "check_transformers",
    "check_versions",
    "check_visible_devices",
    "classify_torch_import",
    "exit_code",
    "format_findings",
    "gather",
    "main",
    "probe_torch_import",
]


# --------------------------------------------------------------------------- gathering


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cann_version(env: Mapping[str, str]) -> str | None:
    """The CANN toolkit version from ``ASCEND_TOOLKIT_HOME`` / ``ASCEND_HOME_PATH`` (set by
    ``set_env.sh``) or the default install folder; None when none is found."""
    homes = [env.get("ASCEND_TOOLKIT_HOME"), env.get("ASCEND_HOME_PATH"),
             "/usr/local/Ascend/ascend-toolkit/latest"]
    for home in filter(None, homes):
        root = Path(home)
        for info in [root / "version.cfg", *sorted(root.glob("*/ascend_toolkit_install.info")),
                     *sorted(root.glob("*/version.info"))]:
            try:
                text = info.read_text(errors="replace")
            except OSError:
                continue
            match = re.search(r"(?im)^\s*(?:toolkit_installed_)?version\s*=\s*\[?([\d.]+\w*)",
                              text)
            if match:
                return match.group(1)
    return None


def probe_torch_import(timeout_s: float = 120.0) -> Finding:
    """Run ``import torch`` in a fresh interpreter with the caller's own environment."""
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if _ORIGINAL_AUTOLOAD is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _ORIGINAL_AUTOLOAD
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                              text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        return Finding("import torch", "fail", f"import torch took over {timeout_s:.0f} s",
                       "check the filesystem torch is installed on")
    return classify_torch_import(proc.returncode, proc.stderr)


def _model_geometry(model: str, device: Any, dtype: str) -> tuple[int, int, int]:
    """(bytes per block, block size, context length) of the HF model folder ``model``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    num_layers, num_heads, num_kv_heads, head_dim = hf_config.attention_geometry(config)
    backend_cls = get_backend_class(backend_name_for(platform.device_type(device), "auto"))
    block_size = backend_cls.preferred_block_size()
    backend = backend_cls(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                          dtype=platform.resolve_dtype(dtype, device), device=device)
    return (backend.bytes_per_block(block_size, num_layers), block_size,
            hf_config.max_position_embeddings(config))


def gather(*, device: str = "auto", model: str | None = None, memory_fraction: float = 0.5,
           num_blocks: int | None = None, env: Mapping[str, str] | None = None) -> list[Finding]:
    """Measure this machine and run every check (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    findings = [check_versions(_version("torch"), _version("torch-npu") or _version("torch_npu"),
                               cann_version(env))]
    torch_import = probe_torch_import()
    findings.append(torch_import)
    findings.append(check_transformers(_version("transformers"), _transformers_spec()))
    if model is not None:
        findings.append(check_model_weights(model))
    if _version("torch") is None:
        skip = "torch is not installed"
        return findings + [Finding(n, "skip", skip) for n in _TORCH_CHECKS]

    try:
        resolved = platform.resolve_device(device)
    except Exception as exc:  # noqa: BLE001 - the reason is the finding
        findings.append(Finding("visible devices", "fail", f"device={device!r}: {exc}",
                                "pick a device that exists, or device='auto'"))
        return findings + [Finding(n, "skip", "no device") for n in _TORCH_CHECKS[1:]]
    kind = platform.device_type(resolved)
    npu = platform.probe_npu()
    cuda_reason = platform.cuda_reason()
    torch = platform.import_torch()
    findings.append(check_visible_devices(
        npu_count=npu.device_count, npu_reason=npu.reason,
        cuda_count=0 if cuda_reason else int(torch.cuda.device_count()),
        cuda_reason=cuda_reason, chosen=str(resolved), env=env))
    findings.append(check_bf16(kind, _bf16_supported(torch, kind)))
    findings.append(check_alloc_conf(env, kind))
    findings.append(_kv_finding(resolved, model, memory_fraction, num_blocks))
    findings.append(_native_finding())

    findings.append(check_compile(device_type=kind, plan=resolve_plan("auto", resolved),
                                  compile_backend=platform.compile_backend(resolved),
                                  has_graph_api=platform.graph_api(resolved) is not None,
                                  env=env))
    return findings


_TORCH_CHECKS = ("visible devices", "bf16", "allocator settings", "KV pool vs free memory",
                 "CPU native kernels", "graph capture / compile")


def _transformers_spec() -> str:
    """The transformers requirement of the installed langchain-ascend (pyproject's pin)."""
    from importlib import metadata

    try:
        for requirement in metadata.requires("langchain-ascend") or []:
            match = re.match(r"transformers\s*([<>=!~][^;]*)", requirement)
            if match:
                return match.group(1).replace(" ", "")
    except metadata.PackageNotFoundError:
        pass
    return TRANSFORMERS_RANGE


def _bf16_supported(torch: Any, kind: str) -> bool | None:
    if kind == "cpu":
        return None
    try:
        return bool(getattr(torch, kind).is_bf16_supported())
    except Exception:  # noqa: BLE001
        return None


def _kv_finding(device: Any, model: str | None, memory_fraction: float,
                num_blocks: int | None) -> Finding:
    memory = platform.memory_info(device)
    geometry: tuple[int, int, int] | None = None
    if model is not None:
        if str(model).endswith(".gguf"):
            return Finding("KV pool vs free memory", "skip", "--model takes a model folder "
                           "(a .gguf file is converted on first load; pass that folder)")
        try:
            geometry = _model_geometry(model, device, "auto")
        except Exception as exc:  # noqa: BLE001
            return Finding("KV pool vs free memory", "fail", f"cannot read {model}: {exc}",
                           "pass a Hugging Face model folder with config.json")
    return check_kv_pool(
        device=str(device), free_bytes=memory.free, total_bytes=memory.total,
        memory_fraction=memory_fraction, num_blocks=num_blocks,
        bytes_per_block=geometry[0] if geometry else None,
        block_size=geometry[1] if geometry else None,
        model_context=geometry[2] if geometry else None)


def _native_finding() -> Finding:
    problem = build.host_problem()
    results: dict[str, str | None] = {}
    if problem is None:
        for kernel in NATIVE_KERNELS:
            loaded = build.load(kernel)
            results[kernel] = None if loaded.lib is not None else loaded.reason
    return check_native(problem, results)


# --------------------------------------------------------------------------- output


_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def format_findings(findings: Sequence[Finding]) -> str:
    """One line per finding (``[ok  ] name: detail``), its fix indented below, a count last."""
    lines = []
    for f in findings:
        lines.append(f"[{_MARKS[f.status]}] {f.name}: {f.detail}")
        if f.fix and f.status != "ok":
            lines.append(f"         fix: {f.fix}")
    counts = {s: sum(f.status == s for f in findings) for s in _MARKS}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def exit_code(findings: Sequence[Finding]) -> int:
    """0 when nothing failed, else 1."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``langchain-ascend doctor [--json] [--device D] [--model DIR] ...``."""
    parser = argparse.ArgumentParser(
        prog="langchain-ascend doctor",
        description="check torch / torch-npu / CANN, devices, dtype, allocator, memory, "
                    "transformers, CPU kernels and graph capture; exit 1 when a check fails")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--device", default="auto", help="the device to check (default auto)")
    parser.add_argument("--model", help="a model folder or .gguf file: its weights' format "
                        "and bytes, and (a folder) its KV pool")
    parser.add_argument("--kv-cache-memory-fraction", type=float, default=0.5,
                        help="the chat model's kv_cache_memory_fraction (default 0.5)")
    parser.add_argument("--num-kv-blocks", type=int, help="the chat model's num_kv_blocks")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    findings = gather(device=args.device, model=args.model,
                      memory_fraction=args.kv_cache_memory_fraction, num_blocks=args.num_kv_blocks)
    if args.json:
        print(json.dumps({"findings": [asdict(f) for f in findings],
                          "exit_code": exit_code(findings)}, indent=2))
    else:
        print(format_findings(findings))
    return exit_code(findings)
