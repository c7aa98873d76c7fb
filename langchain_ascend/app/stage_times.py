"""Wall and CPU seconds of each setup stage, for the demo's and the server's setup line, and
the progress bar over named steps that records them (:func:`stages`).

A busy machine stretches wall time (on this project's shared 2-core VM a first run took from
20 s to 170 s of wall time for the same ~40 s of CPU), so each stage records both: the
process's CPU time counts its threads and the compilers it waited for (``RUSAGE_CHILDREN``).
:func:`recording` collects what :func:`record` is told inside it::

    with recording() as times:
        with stage("source"):
            ...
    print(times.summary())  # "source 1.2 s (CPU 1.0 s)"
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its finished child processes."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def process_age_s() -> float | None:
    """Wall seconds since this process started (Linux ``/proc``; None elsewhere): with the
    imports before the first stage, which no stage records."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))


@dataclasses.dataclass(frozen=True)
class StageTime:
    """One stage: its name, wall seconds and CPU seconds."""

    name: str
    wall_s: float
    cpu_s: float


@dataclasses.dataclass
class StageTimes:
    """The stages recorded so far, in order."""

    stages: list[StageTime] = dataclasses.field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(item.wall_s for item in self.stages)

    @property
    def cpu_s(self) -> float:
        return sum(item.cpu_s for item in self.stages)

    def summary(self) -> str:
        """``"source 1.2 s (CPU 1.0 s); load 5.0 s (CPU 6.1 s)"``."""
        return "; ".join(f"{item.name} {item.wall_s:.1f} s (CPU {item.cpu_s:.1f} s)"
                         for item in self.stages)


_current: contextvars.ContextVar[StageTimes | None] = contextvars.ContextVar(
    "langchain_ascend_stage_times", default=None)


@contextlib.contextmanager
def recording() -> Iterator[StageTimes]:
    """Collect the stages recorded inside the block (nested blocks collect their own)."""
    times = StageTimes()
    token = _current.set(times)
    try:
        yield times
    finally:
        _current.reset(token)


def record(name: str, wall_s: float, cpu_s: float) -> None:
    """Add a stage to the innermost :func:`recording` (nothing outside one)."""
    times = _current.get()
    if times is not None:
        times.stages.append(StageTime(name, wall_s, cpu_s))


class StageClock:
    """Times consecutive stages: :meth:`lap` records the stage that just ended."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), cpu_seconds()

    def lap(self, name: str) -> StageTime:
        wall, cpu = time.perf_counter(), cpu_seconds()
        item = StageTime(name, wall - self._wall, cpu - self._cpu)
        self._wall, self._cpu = wall, cpu
        record(item.name, item.wall_s, item.cpu_s)
        return item


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Record the block as one stage (also when it raises)."""
    clock = StageClock()
    try:
        yield
    finally:
        clock.lap(name)


@contextlib.contextmanager
def stages(desc: str, names: Sequence[str], *, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A tqdm bar over named steps; the context gives ``advance()``, called after each step."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(names), desc=desc, unit="step", disable=not enabled, leave=True)
    done = 0
    clock = StageClock()  # each step's wall and CPU time, for the setup line

    def advance() -> None:
        nonlocal done
        clock.lap(names[done])
        done += 1
        bar.update(1)
        if done < len(names):
            bar.set_postfix_str(names[done])

    bar.set_postfix_str(names[0])
    try:
        yield advance
    finally:
        bar.close()
