"""The disk guard: a job waits, saying why, while its output's filesystem has less free space than
its next checkpoint needs (its `--min-free`, else twice its last checkpoint, `ckpt_bytes`), rather
than start into a save that fails. Its output: its checkpoints' directory, else its working
directory, or their nearest parent that exists. One statvfs per ready job that asks; no file read.
"""

from __future__ import annotations

import os
from typing import Optional

from gpuq.core.job import Job
from gpuq.engine.schedule.scheduler import Wait

# How every wait for disk space begins, the guard's and a full spool's (engine/views/status.py,
# run/worker.py): it ends when someone frees space, which no one can know, so it has no start time.
WAITING = "waiting for disk space"


def need_bytes(job: Job) -> Optional[int]:
    if job.min_free_bytes:
        return job.min_free_bytes
    return 2 * job.ckpt_bytes if job.ckpt_bytes else None


def guarded(job: Job) -> bool:
    return need_bytes(job) is not None


def wait(job: Job) -> Optional[Wait]:
    """Why the job waits for disk space, or None (room enough, nothing asked, or unreadable); for
    good where its --min-free is more than its filesystem holds in all."""
    need = need_bytes(job)
    if need is None:
        return None
    where = output_of(job.cmd, job.cwd, job.ckpt_glob)
    try:
        found = os.statvfs(where)
    except OSError:
        return None
    free = found.f_bavail * found.f_frsize
    if job.min_free_bytes and job.min_free_bytes > found.f_blocks * found.f_frsize:
        return Wait(_never(job.min_free_bytes, where, found), True)
    if free >= need:
        return None
    why = f"--min-free {_size(need)}" if job.min_free_bytes else f"twice its last checkpoint, {_size(need // 2)}"
    return Wait(f"{WAITING}: {where} has {_size(free)} free, it needs {_size(need)} ({why})", False)


def output_of(cmd: list[str], cwd: str, ckpt_glob: Optional[str]) -> str:
    """A job's output: its checkpoints' directory, else its working directory, or their nearest parent that exists."""
    from gpuq.engine.tracking import checkpoints  # glob and patterns: only for a job the guard holds

    where = checkpoints.base_of(cmd, cwd, ckpt_glob) or cwd
    while where and not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    return where


def never_fits(min_free: Optional[int], cmd: list[str], cwd: str, ckpt_glob: Optional[str]) -> Optional[str]:
    """Why a --min-free can never be met (more than its output's filesystem holds in all), or None
    (`add` and `edit` refuse it)."""
    if not min_free:
        return None
    where = output_of(cmd, cwd, ckpt_glob)
    try:
        found = os.statvfs(where)
    except OSError:
        return None
    return _never(min_free, where, found) if min_free > found.f_blocks * found.f_frsize else None


def _never(need: int, where: str, found: os.statvfs_result) -> str:
    # triage (engine/views/fixes.py) reads the free size back to offer a --min-free that fits
    total, free = found.f_blocks * found.f_frsize, found.f_bavail * found.f_frsize
    size = f"a filesystem of {_size(total)}, {_size(free)} free"
    return f"needs {_size(need)} free disk space (--min-free); {where} is on {size}"


def holds(wait: Optional[Wait]) -> bool:
    """Whether `wait` is one for disk space (the guard's, a full spool's)."""
    return wait is not None and wait.reason.startswith(WAITING)


def _size(count: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f}{unit}"
    return f"{count}B"


def waits(pending: list[Job]) -> dict[int, Wait]:
    """What `gpuq status` says of the pending jobs the guard holds (a statvfs for each that asks)."""
    return {job.id: held for job in pending if (held := wait(job)) is not None}
