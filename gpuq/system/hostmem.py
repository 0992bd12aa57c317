"""The host memory a job's process tree holds, as the supervisor's watch reads it.

PSS, not RSS: forked DataLoader workers share their parent's pages, and a sum of RSS counts each
shared page once per process (eight workers of a 10 GiB trainer would read as 90 GiB). Linux gives
PSS in /proc/PID/smaps_rollup; where that cannot be read, RSS is summed, which can only overstate.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from gpuq.system.procs import load_psutil


def tree_bytes(pid: int) -> int:
    """Bytes of memory process `pid` and its descendants hold (0 once it is gone)."""
    psutil = load_psutil()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    return sum(_process_bytes(proc) for proc in procs)


def _process_bytes(proc: Any) -> int:
    with suppress(OSError, ValueError, IndexError), open(f"/proc/{proc.pid}/smaps_rollup", "rb") as fh:
        for line in fh:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) << 10  # KiB
    try:
        return proc.memory_info().rss
    except Exception:  # noqa: BLE001 - gone, or not ours to read: it holds nothing we can count
        return 0
