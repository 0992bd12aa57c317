"""Processes: identity (pid + start time + boot id: a pid alone is reused) and liveness
(proctree.py ends a job's processes)."""

from __future__ import annotations

import os
from functools import cache
from typing import Any, Optional

from gpuq.core.job import Job

CREATE_TIME_TOLERANCE = 0.05  # seconds; psutil derives it from clock ticks, so it is stable


def load_psutil() -> Any:
    """psutil, imported when first needed: a heavy import `gpuq status` and `gpuq add` never pay."""
    import psutil  # see above: gpuq's one import of psutil

    return psutil


@cache
def boot_id() -> str:
    """Identifies this boot: a process recorded under another boot id is certainly gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return f"boot-{int(load_psutil().boot_time())}"


def current_umask() -> int:
    """This process's umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def pid_alive(pid: int) -> bool:
    """Cheap existence test (pid only): good enough for tmp-file owners, never for jobs."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive all the same
        pass
    return True


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP, Ctrl-Z, a debugger): its state in /proc, which costs
    `status` no psutil; psutil's where there is no /proc (macOS)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:  # "PID (COMM) STATE ...": COMM may hold ") "
            return fh.read().rpartition(b")")[2].split()[:1] in ([b"T"], [b"t"])
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False  # gone since
    except OSError:
        return False
    psutil = load_psutil()
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def create_time(pid: int) -> Optional[float]:
    psutil = load_psutil()
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def identity(pid: int) -> dict[str, Any]:
    """What we record to recognise this process later."""
    return {"pid": pid, "create_time": create_time(pid), "boot_id": boot_id()}


def is_same_process(pid: Optional[int], recorded_create_time: Optional[float], recorded_boot: Optional[str]) -> bool:
    """True only if the recorded process is still running (not a zombie, not a pid reuse)."""
    if not pid or recorded_create_time is None:
        return False
    if recorded_boot and recorded_boot != boot_id():
        return False
    psutil = load_psutil()
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - recorded_create_time) > CREATE_TIME_TOLERANCE:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def job_alive(job: Job) -> bool:
    return is_same_process(job.pid, job.pid_create_time, job.boot_id)


def which(command: str, path: Optional[str] = None) -> Optional[str]:
    """`shutil.which`, without importing shutil (bz2, lzma, fnmatch) on `gpuq add`'s path."""
    if "/" in command:
        return command if os.path.isfile(command) and os.access(command, os.X_OK) else None
    search = os.environ.get("PATH", os.defpath) if path is None else path
    for directory in search.split(os.pathsep):
        candidate = os.path.join(directory or ".", command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
