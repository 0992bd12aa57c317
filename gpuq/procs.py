"""Processes: identity (pid + start time + boot id), liveness, and killing a job's whole tree.

A pid alone is reused by the kernel, so a job's process is "the same" only if its pid, its start
time and the boot it was recorded in all match. psutil is imported lazily: `gpuq add` never needs it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

CREATE_TIME_TOLERANCE = 0.05  # seconds; psutil derives it from clock ticks, so it is stable


def pid_alive(pid: int) -> bool:
    """Cheap existence test (pid only): good enough for tmp-file owners, never for jobs."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_time(pid: int) -> Optional[float]:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def identity(pid: int) -> dict[str, Any]:
    """What we record to recognise this process later."""
    from gpuq.spool import boot_id

    return {"pid": pid, "create_time": create_time(pid), "boot_id": boot_id()}


def is_same_process(pid: Optional[int], recorded_create_time: Optional[float], recorded_boot: Optional[str]) -> bool:
    """True only if the recorded process is still running (not a zombie, not a pid reuse)."""
    if not pid or recorded_create_time is None:
        return False
    from gpuq.spool import boot_id

    if recorded_boot and recorded_boot != boot_id():
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - recorded_create_time) > CREATE_TIME_TOLERANCE:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def job_alive(job: dict[str, Any]) -> bool:
    return is_same_process(job.get("pid"), job.get("pid_create_time"), job.get("boot_id"))


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def tree_processes(pid: int) -> list[Any]:
    """The process and all its descendants now, those that left its group included.

    psutil.Process objects remember the start time, so killing them later cannot hit a reused pid.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        return [proc] + proc.children(recursive=True)
    except psutil.Error:
        return []


def terminate_tree(job: dict[str, Any], grace: float, force: bool = True) -> bool:
    """SIGTERM the job's process group, wait up to `grace`, then (if `force`) SIGKILL the group
    and every descendant that left it. Returns True once the job's process is gone."""
    pid = job.get("pid")
    if not job_alive(job):
        return True
    snapshot = tree_processes(pid)
    signal_group(pid, signal.SIGTERM)
    if wait_gone(job, grace):
        return True
    if not force:
        return False
    kill_all(pid, snapshot)
    return wait_gone(job, 10.0)


def kill_all(pgid: int, snapshot: list[Any]) -> None:
    import psutil

    signal_group(pgid, signal.SIGKILL)
    for proc in snapshot + tree_processes(pgid):
        try:
            proc.kill()
        except psutil.Error:
            pass


def wait_gone(job: dict[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while job_alive(job):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
