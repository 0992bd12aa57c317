"""A job's host limits (`--mem`, `--cpus`) kept while it runs (spool_layout.md section 12a), the
first way that works here: its own cgroup v2, a scope of the user's systemd, else the watch (the PSS
of the job's tree read every GPUQ_MEM_WATCH_SECONDS; past `mem_mib` the job is stopped as its time
limit would). A job ended at its memory limit fails saying so rather than with a bare exit 137.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from gpuq.core.job import Job
from gpuq.core.words import size_text
from gpuq.run.notify.send import env_seconds
from gpuq.system import cgroups, hostmem

CGROUP, SCOPE, WATCH = "cgroup2", "systemd-run", "watch"  # `host_limits_by`; the watch's as "watch:SECONDS"
MODE_ENV, WATCH_ENV = "GPUQ_HOST_LIMITS", "GPUQ_MEM_WATCH_SECONDS"
DEFAULT_WATCH_SECONDS = 2.0  # a job growing 1 GiB/s passes its limit by at most 2 GiB before it is stopped
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the thread pools of torch, numpy and MKL

Say = Callable[[str], None]  # a line for the job's log


@dataclass(eq=False)
class Keeper:  # how one run's host limits are kept, and whether its memory limit ended it
    by: str  # CGROUP, SCOPE or WATCH
    mem_mib: Optional[int]
    cpus: Optional[int]
    cgroup: Optional[str] = None  # the job's cgroup (CGROUP)
    unit: Optional[str] = None  # its scope's unit (SCOPE)
    period: float = DEFAULT_WATCH_SECONDS  # seconds between two looks (WATCH)
    reached: bool = False  # its memory limit ended it
    seen: int = 0  # bytes the watch saw past the limit

    def recorded(self) -> str:
        return f"{WATCH}:{self.period:g}" if self.by == WATCH else self.by


def keep(job: Job, say: Say) -> Optional[Keeper]:
    """The way this run's limits are kept (its cgroup made, if that is the way); None if it has none."""
    if not (job.mem_mib or job.cpus):
        return None
    why: list[str] = []
    if os.environ.get(MODE_ENV, "").strip() == WATCH:
        why.append(f"{MODE_ENV}=watch")
    else:
        keeper = _in_cgroup(job, why) or _in_scope(job, why)
        if keeper is not None:
            say(f"host limits kept by {keeper.cgroup or keeper.unit}")
            return keeper
    watched = "its memory is watched" if job.mem_mib else "nothing to watch"
    say(f"host limits not kept by the kernel ({'; '.join(why)}): {watched}, its CPUs counted, not capped")
    period = env_seconds(WATCH_ENV, DEFAULT_WATCH_SECONDS, sys.float_info.max)  # a finite time
    return Keeper(WATCH, job.mem_mib, job.cpus, period=period)


def ignored_settings() -> list[str]:
    """What the worker's log says, once, of a GPUQ_HOST_LIMITS or GPUQ_MEM_WATCH_SECONDS that `keep`
    would pass over without a word in every job's run."""
    said = []
    mode = os.environ.get(MODE_ENV, "").strip()
    if mode and mode != WATCH:
        said.append(f"{MODE_ENV}: {mode!r} is not {WATCH!r}; ignored: host limits are kept by the kernel where it can")
    seconds = os.environ.get(WATCH_ENV)
    if seconds and env_seconds(WATCH_ENV, -1.0, sys.float_info.max) < 0:  # set, and not seconds above 0
        said.append(f"{WATCH_ENV}: {seconds!r} is not seconds above 0; watching every {DEFAULT_WATCH_SECONDS:g} s")
    return said


def _in_cgroup(job: Job, why: list[str]) -> Optional[Keeper]:
    tree, not_here = cgroups.gpuq_tree()
    if tree is None:
        why.append(not_here)
        return None
    name = f"job-{job.id}-{os.getpid()}"  # this supervisor's pid: unique among the spools of the machine
    try:
        path = cgroups.job_cgroup(tree, name, job.mem_mib, job.cpus)
    except OSError as exc:
        why.append(f"cgroup {os.path.join(tree, name)}: {exc.strerror or exc}")
        return None
    return Keeper(CGROUP, job.mem_mib, job.cpus, cgroup=path)


def _in_scope(job: Job, why: list[str]) -> Optional[Keeper]:
    usable, not_here = cgroups.user_scope()
    if not usable:
        why.append(not_here)
        return None
    unit = f"gpuq-{job.id}-{os.getpid()}-{job.attempts}.scope"  # systemctl needs the suffix
    return Keeper(SCOPE, job.mem_mib, job.cpus, unit=unit)


def command(keeper: Optional[Keeper], cmd: list[str]) -> list[str]:
    """The job's command, inside its scope where that is the way (systemd-run execs it: same pid)."""
    if keeper is None or keeper.unit is None:
        return cmd
    return [*cgroups.scope_argv(keeper.unit, keeper.mem_mib, keeper.cpus), *cmd]


def entering(keeper: Optional[Keeper]) -> Optional[Callable[[], None]]:
    """Between fork and exec: join its cgroup, so that not even its first child runs outside it."""
    if keeper is None or keeper.cgroup is None:
        return None
    path = keeper.cgroup
    return lambda: cgroups.join(path)


def add_variables(env: dict[str, str], job: Job, keeper: Optional[Keeper]) -> None:
    """OMP_NUM_THREADS and MKL_NUM_THREADS from `cpus`, unless the job's own env sets them (the
    queuing shell's were set for its machine). systemd-run needs XDG_RUNTIME_DIR to find its manager."""
    if job.cpus:
        for name in THREAD_VARIABLES:
            if name not in job.env:
                env[name] = str(job.cpus)
    if keeper is not None and keeper.by == SCOPE:
        env.setdefault("XDG_RUNTIME_DIR", cgroups.runtime_dir())


class MemoryWatch:
    """The watch, one of the wait's samplers: `take_if_due` is True once the tree is past its limit."""

    def __init__(self, keeper: Keeper, pid: int):
        self.keeper, self.pid = keeper, pid
        self.limit = (keeper.mem_mib or 0) << 20
        self.due = time.time() + keeper.period

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.time())

    def take_if_due(self) -> bool:
        now = time.time()
        if now < self.due:
            return False
        self.due = now + self.keeper.period
        used = hostmem.tree_bytes(self.pid)
        if used <= self.limit:
            return False
        self.keeper.seen = used
        return True


def memory_watch(keeper: Optional[Keeper], pid: int) -> Optional[MemoryWatch]:
    if keeper is None or keeper.by != WATCH or not keeper.mem_mib:
        return None
    return MemoryWatch(keeper, pid)


def stops(keeper: Optional[Keeper], grace: float) -> Optional[str]:
    """The log's line if the watch ended the wait for a job that still runs (past its --mem)."""
    if keeper is None or not keeper.seen:
        return None
    keeper.reached = True
    limit, held = size_text(keeper.mem_mib or 0), f"{keeper.seen / (1 << 20):.0f}M"
    return f"host memory limit of {limit} reached ({held} held): stopping the job (SIGKILL after {grace:g}s)"


def reached(keeper: Optional[Keeper]) -> Optional[str]:
    return size_text(keeper.mem_mib) if keeper is not None and keeper.reached and keeper.mem_mib else None


def close(keeper: Optional[Keeper], say: Say) -> None:
    """Once the job's processes are gone: whether the kernel ended it at its memory limit, and its
    cgroup removed."""
    if keeper is None:
        return
    if keeper.cgroup is not None:
        if keeper.mem_mib and cgroups.oom_kills(keeper.cgroup):
            keeper.reached = True
        if not cgroups.remove(keeper.cgroup):
            say(f"cgroup {keeper.cgroup} kept: processes that left the job's group still run in it")
    elif keeper.unit is not None and keeper.mem_mib and cgroups.scope_oom_killed(keeper.unit):
        keeper.reached = True
    if keeper.reached and keeper.by != WATCH:
        say(f"host memory limit of {size_text(keeper.mem_mib or 0)} reached: the kernel ended the job's processes")
