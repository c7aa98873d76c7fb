"""The device layer: the CPU path for real, NPU/CUDA selection with the imports faked."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types

import pytest
import torch

from langchain_ascend import platform
from langchain_ascend.errors import DeviceUnavailableError, InvalidRequestError


@pytest.fixture(autouse=True)
def _fresh_probe():
    platform.probe_npu.cache_clear()
    yield
    platform.probe_npu.cache_clear()


def _fake_npu_module(count: int, bf16: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        is_available=lambda: count > 0,
        device_count=lambda: count,
        is_bf16_supported=lambda: bf16,
    )


def _install_fake_torch_npu(monkeypatch, *, import_error: Exception | None, count: int = 1):
    """Make `find_spec('torch_npu')` succeed and `import torch_npu` fail or register torch.npu."""
    spec = importlib.machinery.ModuleSpec("torch_npu", loader=None)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        platform.importlib.util, "find_spec",
        lambda name, *a, **k: spec if name == "torch_npu" else real_find_spec(name, *a, **k),
    )
    real_import = platform.importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name != "torch_npu":
            return real_import(name, *args, **kwargs)
        if import_error is not None:
            raise import_error
        # The real torch_npu makes "npu" a torch device type; renaming privateuse1 here would
        # leak into every later test (torch.manual_seed looks torch.npu up), so device objects
        # are faked as their strings instead.
        monkeypatch.setattr(platform, "_make_device", lambda kind, index: f"{kind}:{index}")
        monkeypatch.setattr(torch, "npu", _fake_npu_module(count), raising=False)
        return types.ModuleType("torch_npu")

    monkeypatch.setattr(platform.importlib, "import_module", fake_import)


def _no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_cpu_is_resolved_for_real():
    dev = platform.resolve_device("cpu")
    assert dev == torch.device("cpu")
    assert platform.default_dtype(dev) == torch.float32
    assert platform.new_stream(dev) is None
    assert platform.current_stream(dev) is None
    assert platform.new_event(dev) is None
    platform.synchronize(dev)  # no-op, must not raise
    with platform.use_stream(None):
        assert torch.ones(2).sum().item() == 2.0
    mem = platform.memory_info(dev)
    assert 0 < mem.free <= mem.total


def test_auto_without_accelerators_is_cpu(monkeypatch):
    _no_cuda(monkeypatch)
    monkeypatch.setattr(platform.importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "torch_npu" else importlib.machinery.ModuleSpec(name, None))
    assert platform.resolve_device("auto") == torch.device("cpu")
    assert "not installed" in platform.probe_npu().reason


def test_explicit_npu_without_torch_npu_names_the_package(monkeypatch):
    monkeypatch.setattr(platform.importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "torch_npu" else importlib.machinery.ModuleSpec(name, None))
    with pytest.raises(DeviceUnavailableError, match="torch_npu is not installed"):
        platform.resolve_device("npu")


def test_explicit_npu_without_cann_names_cann(monkeypatch):
    _install_fake_torch_npu(monkeypatch, import_error=ImportError("libhccl.so: cannot open shared object file"))
    with pytest.raises(DeviceUnavailableError, match="CANN libraries were not found"):
        platform.resolve_device("npu:0")


def test_explicit_npu_with_no_device(monkeypatch):
    _install_fake_torch_npu(monkeypatch, import_error=None, count=0)
    with pytest.raises(DeviceUnavailableError, match="no NPU device"):
        platform.resolve_device("npu")


def test_auto_prefers_a_working_npu(monkeypatch):
    _install_fake_torch_npu(monkeypatch, import_error=None, count=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # NPU still wins
    assert platform.resolve_device("auto") == "npu:0"
    assert platform.resolve_device("npu:1") == "npu:1"
    with pytest.raises(DeviceUnavailableError, match="only 2 npu"):
        platform.resolve_device("npu:2")
    assert platform.compile_backend("npu:0") == "npugraph_ex"
    assert platform.default_dtype("npu:0") == torch.bfloat16


def test_auto_falls_back_to_cuda_when_npu_is_broken(monkeypatch):
    _install_fake_torch_npu(monkeypatch, import_error=ImportError("libascendcl.so missing"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert platform.resolve_device("auto") == torch.device("cuda", 0)


def test_explicit_cuda_on_cpu_build_says_why(monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        platform.resolve_device("cuda")


@pytest.mark.parametrize("bad", ["tpu", "npu:x", "gpu0"])
def test_unknown_device_strings_are_rejected(bad):
    with pytest.raises(DeviceUnavailableError, match="device"):
        platform.resolve_device(bad)


def test_resolve_dtype_names():
    cpu = torch.device("cpu")
    assert platform.resolve_dtype("auto", cpu) == torch.float32
    assert platform.resolve_dtype("bf16", cpu) == torch.bfloat16
    assert platform.resolve_dtype("torch.float16", cpu) == torch.float16
    assert platform.resolve_dtype(torch.float32, cpu) == torch.float32
    with pytest.raises(InvalidRequestError, match="dtype='int3' is not supported"):
        platform.resolve_dtype("int3", cpu)
    with pytest.raises(ValueError, match="float8"):  # still a ValueError for callers
        platform.resolve_dtype("float8", cpu)


def test_cpu_has_no_index():
    with pytest.raises(DeviceUnavailableError, match="the CPU has no index"):
        platform.resolve_device("cpu:1")
    assert platform.resolve_device("cpu:0").type == "cpu"


def test_package_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import langchain_ascend; "
        "dt = time.perf_counter() - t; "
        "print(dt, 'torch' in sys.modules, 'torch_npu' in sys.modules, sorted(langchain_ascend.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 3)
    assert float(out[0]) < 2.0
    assert out[1] == "False" and out[2] == "False"
    assert "AscendChatModel" in out[3] and "NPUStreamToolExecutor" in out[3]


def test_probably_cpu_guesses_without_torch(monkeypatch):
    import importlib.util

    from langchain_ascend import platform as plat

    assert plat.probably_cpu("cpu") and plat.probably_cpu(" CPU ")
    assert not plat.probably_cpu("npu:0") and not plat.probably_cpu("cuda")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_npu" else real_find_spec(name, *a))
    assert not plat.probably_cpu("auto")  # torch_npu installed: auto may pick an NPU
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch_npu" else real_find_spec(name, *a))
    monkeypatch.setattr(plat.os.path, "exists", lambda path: path == "/dev/nvidia0")
    assert not plat.probably_cpu(None)  # an NVIDIA device node: auto may pick CUDA
    monkeypatch.setattr(plat.os.path, "exists", lambda path: False)
    assert plat.probably_cpu(None) and plat.probably_cpu("auto")
