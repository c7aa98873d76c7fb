"""Record the device side of a timed run with ``torch_npu.profiler`` (MindStudio Insight reads it).

Only the profiler API that ASCEND_API.md lists is used: ``torch_npu.profiler.profile`` with
``activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]`` and
``on_trace_ready=tensorboard_trace_handler(dir)``, started and stopped around the run. torch_npu
itself is imported by :mod:`langchain_ascend.platform` (the package's one import site); this
module takes the module it loaded. Written from the torch_npu docs; not yet run on hardware.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from langchain_ascend import platform
from langchain_ascend.errors import DeviceUnavailableError


def profiler_problem() -> str | None:
    """Why ``torch_npu.profiler`` cannot record here, or None when it can."""
    probe = platform.probe_npu()
    if not probe.available:
        return probe.reason
    module = sys.modules.get("torch_npu")
    if module is None or not hasattr(module, "profiler"):
        return "torch_npu imported without its profiler module"
    return None


def start_profiler(directory: Path) -> Any:
    """Start a ``torch_npu.profiler.profile`` writing into ``directory``; returns it started
    (call ``.stop()`` to finish and write the trace).

    Raises:
        DeviceUnavailableError: No usable NPU / torch_npu here (the reason is in the message).
    """
    problem = profiler_problem()
    if problem is not None:
        raise DeviceUnavailableError(f"AscendTimeline(profile_npu=True) needs an NPU: {problem}")
    profiler = sys.modules["torch_npu"].profiler
    directory.mkdir(parents=True, exist_ok=True)
    prof = profiler.profile(
        activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
        on_trace_ready=profiler.tensorboard_trace_handler(str(directory)),
    )
    prof.start()
    return prof
