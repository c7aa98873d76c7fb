"""``langchain-ascend doctor``: each check on fake inputs (good and bad), and the command on
this machine (a subprocess: exit code, text and JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from langchain_ascend.app import doctor
from langchain_ascend.app.doctor import Finding

GIB = 2**30
CANN_LIBS_MISSING = (
    "Traceback (most recent call last):\n  ...\nImportError: libhccl.so: cannot open shared "
    "object file: No such file or directory\n\nThe above exception was the direct cause of the "
    "following exception:\n\nRuntimeError: Failed to load the backend extension: torch_npu. "
    "You can disable extension auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.\n")


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(("torch", "npu", "cann", "status", "needle"), [
    ("2.9.0", "2.9.0", "8.5.0", "ok", "CANN 8.5.0"),
    ("2.9.0+cpu", "2.9.0.post1", "9.0.0", "ok", "torch-npu 2.9.0.post1"),
    ("2.12.0", "2.12.0", "9.1.0", "ok", "CANN 9.1.0"),
    ("2.14.0", "2.14.0", "9.1.0", "ok", "no CANN version listed"),
    ("2.13.0", "2.12.0", "9.1.0", "fail", "pins torch exactly"),
    ("2.12.0", "2.12.0", "8.5.0", "fail", "built for CANN 9.1.0"),
    ("2.12.0", "2.12.0", None, "warn", "could not be read"),
    ("2.11.0", "2.11.0", "9.0.0", "warn", "not a pair we list"),
    ("2.13.0", None, None, "skip", "torch-npu is not installed"),
    (None, None, None, "fail", "torch is not installed"),
])
def test_check_versions(torch: str | None, npu: str | None, cann: str | None, status: str,
                        needle: str) -> None:
    finding = doctor.check_versions(torch, npu, cann)
    assert finding.status == status and needle in finding.detail
    assert finding.fix or status in ("ok", "skip")


def test_version_table_matches_readme() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for npu, (torch, canns) in doctor.TORCH_NPU_PAIRS.items():
        assert f"torch-npu {npu} ↔ torch {torch}" in readme
        for cann in canns:
            assert cann in readme


# --------------------------------------------------------------------------- import torch


def test_classify_torch_import() -> None:
    assert doctor.classify_torch_import(0, "").status == "ok"
    broken = doctor.classify_torch_import(1, CANN_LIBS_MISSING)
    assert broken.status == "fail" and "CANN" in broken.detail
    assert "set_env.sh" in broken.fix and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in broken.fix
    missing = doctor.classify_torch_import(1, "ModuleNotFoundError: No module named 'torch'")
    assert missing.status == "fail" and missing.fix == "pip install torch"
    other = doctor.classify_torch_import(1, "OSError: libtorch_cpu.so: bad ELF\n")
    assert other.status == "fail" and "bad ELF" in other.detail


def test_probe_torch_import_here() -> None:
    assert doctor.probe_torch_import().status == "ok"


# --------------------------------------------------------------------------- devices, bf16


def _devices(**kw: object) -> Finding:
    args: dict[str, object] = {"npu_count": 0, "npu_reason": "torch_npu is not installed",
                               "cuda_count": 0, "cuda_reason": "CPU build", "chosen": "cpu",
                               "env": {}}
    args.update(kw)
    return doctor.check_visible_devices(**args)  # type: ignore[arg-type]


def test_check_visible_devices() -> None:
    plain = _devices()
    assert plain.status == "ok" and "auto picks cpu" in plain.detail
    npu = _devices(npu_count=8, chosen="npu:0", env={"ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    assert npu.status == "ok" and "NPU: 8" in npu.detail
    hidden = _devices(env={"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.status == "warn" and "hides every CUDA device" in hidden.detail
    bad = _devices(env={"ASCEND_RT_VISIBLE_DEVICES": "npu0"})
    assert bad.status == "warn" and "not a comma-separated list" in bad.detail
    unseen = _devices(npu_reason="reports no NPU device",
                      env={"ASCEND_RT_VISIBLE_DEVICES": "3"})
    assert unseen.status == "warn" and "npu-smi" in unseen.fix
    uuid = _devices(cuda_count=1, chosen="cuda:0",
                    env={"CUDA_VISIBLE_DEVICES": "GPU-8f2a-11"})
    assert uuid.status == "ok"


def test_check_bf16() -> None:
    assert doctor.check_bf16("cpu", None).status == "skip"
    assert doctor.check_bf16("npu", True).status == "ok"
    old = doctor.check_bf16("npu", False)
    assert old.status == "warn" and "910A" in old.detail
    assert doctor.check_bf16("cuda", None).status == "warn"


# --------------------------------------------------------------------------- allocator


@pytest.mark.parametrize(("env", "device", "status", "needle"), [
    ({}, "npu", "ok", "defaults"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, "npu", "ok", "expandable"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128,"
                                "garbage_collection_threshold:0.6"}, "npu", "ok", "128"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:1,512:2,>:8],"
                                 "backend:cudaMallocAsync"}, "cuda", "ok", "backend"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments"}, "npu", "fail", "not key:value"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:yes"}, "npu", "fail", "True or False"),
    ({"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:10"}, "npu", "fail", "above 20"),
    ({"PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:1.5"}, "npu", "fail", "(0, 1)"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandible_segments:True"}, "npu", "warn", "unknown key"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "npu", "warn",
     "reads PYTORCH_NPU_ALLOC_CONF"),
])
def test_check_alloc_conf(env: dict[str, str], device: str, status: str, needle: str) -> None:
    finding = doctor.check_alloc_conf(env, device)
    assert finding.status == status and needle in finding.detail
    assert finding.fix or status == "ok"


# --------------------------------------------------------------------------- KV pool


def test_check_kv_pool_without_a_model() -> None:
    ok = doctor.check_kv_pool(device="npu:0", free_bytes=60 * GIB, total_bytes=64 * GIB,
                              memory_fraction=0.5)
    assert ok.status == "ok" and "30.00 GiB" in ok.detail and "--model" in ok.detail
    cpu = doctor.check_kv_pool(device="cpu", free_bytes=60 * GIB, total_bytes=64 * GIB,
                               memory_fraction=0.5)
    assert "2.00 GiB" in cpu.detail  # the CPU cap
    low = doctor.check_kv_pool(device="npu:0", free_bytes=100 * 2**20, total_bytes=GIB,
                               memory_fraction=0.5)
    assert low.status == "warn"
    assert doctor.check_kv_pool(device="cpu", free_bytes=GIB, total_bytes=GIB,
                                memory_fraction=1.5).status == "fail"


def test_check_kv_pool_with_a_model() -> None:
    block = 16 * 2**20  # 16 MiB a block
    sized = dict(device="npu:0", total_bytes=96 * GIB, memory_fraction=0.5,
                 bytes_per_block=block, block_size=128, model_context=32768)
    ok = doctor.check_kv_pool(free_bytes=80 * GIB, **sized)  # type: ignore[arg-type]
    assert ok.status == "ok" and "2048 blocks (262144 tokens" in ok.detail
    short = doctor.check_kv_pool(free_bytes=3 * GIB, **sized)  # type: ignore[arg-type]
    assert short.status == "warn" and "under one full context" in short.detail
    none = doctor.check_kv_pool(free_bytes=20 * 2**20, **sized)  # type: ignore[arg-type]
    assert none.status == "fail"
    explicit = dict(sized, num_blocks=1000)
    assert doctor.check_kv_pool(free_bytes=60 * GIB, **explicit).status == "ok"  # type: ignore[arg-type]
    assert doctor.check_kv_pool(free_bytes=10 * GIB, **explicit).status == "fail"  # type: ignore[arg-type]
    assert doctor.check_kv_pool(free_bytes=16 * GIB, **explicit).status == "warn"  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the rest


def test_check_transformers() -> None:
    assert doctor.check_transformers("5.23.0").status == "ok"
    assert doctor.check_transformers("5.24.0").status == "warn"
    assert doctor.check_transformers("4.57.1").status == "warn"
    assert doctor.check_transformers(None).status == "fail"
    assert doctor.check_transformers("5.3.0", ">=5.0,<5.24").status == "ok"


def test_transformers_spec_is_pyprojects() -> None:
    assert doctor._transformers_spec().split(",") in (["<5.24", ">=5.0"], [">=5.0", "<5.24"])


def test_check_native() -> None:
    loaded = {k: None for k in doctor.NATIVE_KERNELS}
    assert doctor.check_native(None, loaded).status == "ok"
    failed = doctor.check_native(None, {**loaded, "matvec": "build failed: cc exited 1"})
    assert failed.status == "warn" and "matvec" in failed.detail
    disabled = doctor.check_native("disabled by LANGCHAIN_ASCEND_NATIVE=0", {})
    assert disabled.status == "warn" and "unset" in disabled.fix
    assert doctor.check_native("no C compiler found (set CC, ...)", {}).status == "warn"
    assert doctor.check_native("the CPU lacks avx2", {}).status == "skip"


def test_check_compile() -> None:
    cpu = doctor.check_compile(device_type="cpu", plan="eager", compile_backend="inductor",
                               has_graph_api=False, env={})
    assert cpu.status == "ok" and "eager" in cpu.detail and "inductor" in cpu.detail
    no_cxx = doctor.check_compile(device_type="cpu", plan="eager", compile_backend=None,
                                  has_graph_api=False, env={})
    assert no_cxx.status == "ok" and "no C++ compiler" in no_cxx.detail
    npu = doctor.check_compile(device_type="npu", plan="graphs", compile_backend="npugraph_ex",
                               has_graph_api=True, env={})
    assert npu.status == "ok" and "NPUGraph" in npu.detail
    blocking = doctor.check_compile(device_type="npu", plan="graphs",
                                    compile_backend="npugraph_ex", has_graph_api=True,
                                    env={"ASCEND_LAUNCH_BLOCKING": "1"})
    assert blocking.status == "warn"
    old = doctor.check_compile(device_type="cuda", plan="eager", compile_backend="inductor",
                               has_graph_api=False, env={})
    assert old.status == "warn"


def test_cann_version_from_toolkit_home(tmp_path: object) -> None:
    from pathlib import Path

    home = Path(str(tmp_path)) / "toolkit"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.5.0\n")
    assert doctor.cann_version({"ASCEND_TOOLKIT_HOME": str(home)}) == "8.5.0"
    (home / "version.cfg").write_text("# comment\nversion=9.1.0\n")
    assert doctor.cann_version({"ASCEND_TOOLKIT_HOME": str(home)}) == "9.1.0"


def test_format_and_exit_code() -> None:
    findings = [Finding("a", "ok", "fine", "never shown"), Finding("b", "fail", "broken", "do x"),
                Finding("c", "skip", "n/a")]
    text = doctor.format_findings(findings)
    assert "[FAIL] b: broken" in text and "fix: do x" in text and "never shown" not in text
    assert text.splitlines()[-1] == "1 ok, 0 warn, 1 fail, 1 skip"
    assert doctor.exit_code(findings) == 1 and doctor.exit_code(findings[:1]) == 0


# --------------------------------------------------------------------------- on this machine


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "langchain_ascend.app.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=300, env=env, check=False)


def test_doctor_on_this_machine() -> None:
    proc = _doctor()
    out = proc.stdout
    assert proc.returncode == (1 if "[FAIL]" in out else 0), proc.stderr
    for name in ("torch / torch-npu / CANN", "import torch", "transformers", "visible devices",
                 "bf16", "allocator settings", "KV pool vs free memory", "CPU native kernels",
                 "graph capture / compile"):
        assert f"] {name}:" in out, out
    assert out.strip().splitlines()[-1].endswith("skip")


def test_doctor_json_and_a_failing_setting() -> None:
    env_bad = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments"}
    proc = subprocess.run(
        [sys.executable, "-m", "langchain_ascend.app.cli", "doctor", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env_bad})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    by_name = {f["name"]: f for f in data["findings"]}
    assert by_name["allocator settings"]["status"] == "fail"
    assert data["exit_code"] == 1
    assert all(set(f) == {"name", "status", "detail", "fix"} for f in data["findings"])
