"""What the benchmarks' child processes share: their peak resident memory."""

from __future__ import annotations


def peak_rss_mb() -> float:
    """This process's peak RSS in MB: ``VmHWM`` of ``/proc/self/status`` where there is one.
    (``ru_maxrss`` survives exec: a probe spawned by a parent that already held ours reported
    the parent's peak, 923 MB for llama.cpp's side too.)"""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
