"""The machine's own memory and CPUs, as host admission counts them (engine/schedule/hostroom.py)."""

from __future__ import annotations

import os

from gpuq.system.procs import load_psutil


def memory_mib() -> int:
    """The machine's physical memory in MiB (psutil: /proc/meminfo's MemTotal on Linux)."""
    return load_psutil().virtual_memory().total >> 20


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the OS has one (taskset, a cgroup's
    cpuset, a container), else every CPU the machine has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS has no affinity
        return os.cpu_count() or 1
