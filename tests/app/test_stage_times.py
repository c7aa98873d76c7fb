"""stage_times: each stage's wall and CPU seconds, children's CPU (a compiler) included."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from langchain_ascend.app import stage_times


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_stages_record_wall_and_cpu_in_order() -> None:
    with stage_times.recording() as times:
        with stage_times.stage("busy"):
            _spin(0.3)
        with stage_times.stage("idle"):
            time.sleep(0.3)
    assert [item.name for item in times.stages] == ["busy", "idle"]
    busy, idle = times.stages
    assert busy.cpu_s >= 0.25 and busy.wall_s >= busy.cpu_s * 0.9
    assert idle.wall_s >= 0.25 and idle.cpu_s < 0.15
    assert times.wall_s == busy.wall_s + idle.wall_s
    assert re.fullmatch(r"busy \d+\.\d s \(CPU 0\.3 s\); idle \d+\.\d s \(CPU 0\.0 s\)",
                        times.summary())


def test_a_finished_child_process_counts() -> None:
    clock = stage_times.StageClock()
    code = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert clock.lap("child").cpu_s >= 0.35


def test_nothing_is_recorded_outside_a_recording() -> None:
    with stage_times.recording() as outer:
        with stage_times.recording() as inner:
            stage_times.record("inner", 1.0, 0.5)
        stage_times.record("outer", 2.0, 1.0)
    stage_times.record("nowhere", 3.0, 1.0)
    assert [item.name for item in inner.stages] == ["inner"]
    assert [item.name for item in outer.stages] == ["outer"]


def test_process_age_counts_the_time_since_the_process_started() -> None:
    """A fresh process that sleeps before asking: its age holds the sleep (the imports before
    the demo's first stage are counted the same way)."""
    import subprocess
    import sys

    code = ("import time; time.sleep(0.5); from langchain_ascend.app import stage_times; "
            "print(stage_times.process_age_s())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert 0.5 <= float(done.stdout) < 60
