"""What `gpuq top` shows, as plain data, from the library calls `status`, `gpus` and `log` make, and
an in-memory ring of each GPU's recent utilisation and memory for the sparklines."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuq.cli import render
from gpuq.cli.commands import COMMANDS
from gpuq.core.job import Job
from gpuq.core.states import FINISHED, PENDING, RUNNING
from gpuq.core.times import duration
from gpuq.engine.schedule.gpuview import of_this_queue
from gpuq.engine.tracking import gpuuse
from gpuq.engine.views.status import status
from gpuq.spool import Spool

RING_SAMPLES = 150  # 5 minutes at the default 2 s refresh; a sparkline shows the newest that fit
FINISHED_SHOWN = 5  # the newest finished jobs listed (status gives ten)


class GpuLine:
    __slots__ = ("index", "name", "util", "used_mib", "total_mib", "holders", "utils", "mems")

    def __init__(self, gpu: dict[str, Any], holders: list[str], ring: Ring) -> None:
        self.index, self.name = gpu["index"], gpu.get("name") or "?"
        self.util: Optional[int] = gpu.get("utilization_gpu")
        self.used_mib, self.total_mib = gpu.get("memory_used_mib") or 0, gpu.get("memory_total_mib") or 0
        self.holders = holders
        self.utils, self.mems = ring.series(self.index)


class JobLine:
    """One row of the queue: a job (`job_id`), or a folded sweep (`job_id` None: no key acts on it)."""

    __slots__ = ("job_id", "state", "name", "fraction", "progress", "util", "info", "job", "idle")

    def __init__(self, job_id: Optional[int], state: str, name: str, progress: str, info: str) -> None:
        self.job_id, self.state, self.name, self.progress, self.info = job_id, state, name, progress, info
        self.fraction: Optional[float] = None  # a running job's progress, 0 to 1
        self.util: Optional[int] = None  # mean utilisation of a running job's GPUs now
        self.job: Optional[Job] = None  # the job's record (its log is found from it)
        self.idle = ""  # a running job that held a GPU idle too long: what `status` says of it


@dataclass
class Snapshot:
    at: float
    worker: str
    gpu_title: Optional[str] = None  # None: no GPUs here (jobs take slots)
    gpus: list[GpuLine] = field(default_factory=list)
    running: list[JobLine] = field(default_factory=list)
    waiting: list[JobLine] = field(default_factory=list)  # pending, held, preempted, interrupted, on Slurm
    finished: list[JobLine] = field(default_factory=list)  # newest first
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[JobLine]:
        return self.running + self.waiting + self.finished

    def ids(self) -> list[int]:
        """The jobs a key may act on, in the order shown (a folded sweep is none)."""
        return [line.job_id for line in self.lines() if line.job_id is not None]


class Ring:
    """Per GPU the utilisation and memory of the last looks; a look is added once however many
    refreshes show it (the workers' view is kept a few seconds)."""

    def __init__(self, size: int = RING_SAMPLES) -> None:
        self.size = size
        self.samples: dict[int, deque[tuple[Optional[int], Optional[int]]]] = {}
        self.last_at: Optional[float] = None

    def add(self, view: Optional[dict[str, Any]]) -> None:
        if view is None or view.get("at") == self.last_at:
            return
        self.last_at = view.get("at")
        for gpu in view.get("gpus") or []:
            total = gpu.get("memory_total_mib") or 0
            mem = round(100 * (gpu.get("memory_used_mib") or 0) / total) if total else None
            self.samples.setdefault(gpu["index"], deque(maxlen=self.size)).append((gpu.get("utilization_gpu"), mem))

    def series(self, index: int) -> tuple[list[Optional[int]], list[Optional[int]]]:
        kept = self.samples.get(index, ())
        return [u for u, _m in kept], [m for _u, m in kept]


def take(spool: Spool, ring: Ring) -> Snapshot:
    now = time.time()
    st = status(spool, damaged=render.damaged_cells)  # a damaged job file is a row, as in status
    snap = Snapshot(now, render.worker_line(st.workers, st.outlook(now)))
    ring.add(st.gpus)
    utils = gpu_utils(st.gpus)
    for row in render.group_sweeps(st.rows, st.hidden_sweeps):
        line = _job_line(row, now, utils)
        if row.state == RUNNING:
            snap.running.append(line)
        elif row.state in FINISHED:
            snap.finished.append(line)
        else:
            snap.waiting.append(line)
    snap.finished = sorted(snap.finished, key=lambda line: -(line.job_id or 0))[:FINISHED_SHOWN]
    if st.gpus is not None:
        snap.gpu_title = render.gpu_title(st.gpus, now)
        snap.gpus = gpu_lines(st.gpus, st.rows, spool.home, ring)
    snap.warnings = list(st.warnings)
    return snap


def _job_line(row: Any, now: float, utils: dict[int, Optional[int]]) -> JobLine:
    if isinstance(row, render.SweepRow):
        name, _script, _time, info = row.cells
        return JobLine(None, row.state, name, "", info)
    if getattr(row, "cells", None) is not None:  # a damaged job file: its cells say why
        return JobLine(row.job.id, row.state, row.cells[0], "", row.cells[-1])
    job = row.job
    if row.state == RUNNING:
        progress = render.progress_text(row.estimate, RUNNING, bar=False)
    elif row.state == PENDING:
        progress = render.progress_text(row.estimate, PENDING)
    else:
        ran = duration(render.elapsed(job, now))
        progress = f"ran {ran}" if ran else ""
    line = JobLine(job.id, row.state, job.name, progress, render.info(job, row.state, row.wait, row.stopping, now))
    line.job = job
    if row.state == RUNNING:
        line.fraction = row.estimate.fraction if row.estimate is not None else None
        line.util = mean_util(job, utils)
        if row.gpu_idle:
            line.idle = gpuuse.idle_text(row.gpu_idle)
    return line


def gpu_utils(view: Optional[dict[str, Any]]) -> dict[int, Optional[int]]:
    return {g["index"]: g.get("utilization_gpu") for g in (view or {}).get("gpus") or []}


def mean_util(job: Job, utils: dict[int, Optional[int]]) -> Optional[int]:
    """The mean utilisation of a running job's GPUs now, of those known."""
    known = [utils[i] for i in job.gpus or () if utils.get(i) is not None]
    return round(sum(known) / len(known)) if known else None  # type: ignore[arg-type]  # None filtered out


def gpu_lines(view: dict[str, Any], rows: list[Any], home: str, ring: Ring) -> list[GpuLine]:
    names = {row.job.id: row.job.name for row in rows if row.state == RUNNING}  # a sweep's too
    return [GpuLine(gpu, holders(gpu, names, home), ring) for gpu in view["gpus"]]


def states_of(verb: str) -> tuple[str, ...]:
    """The states of the jobs the command `verb` acts on, as the command table gives them."""
    return next(c.id_states or () for c in COMMANDS if verb in c.names)


def holders(gpu: dict[str, Any], names: dict[Optional[int], str], home: str) -> list[str]:
    """gpuq's jobs, other users' leases and other processes; a lease of this spool's own job is that job."""
    out = [f"#{job_id} {names.get(job_id, '')}".rstrip() for job_id in gpu.get("jobs") or ()]
    for lease in gpu.get("leases") or ():
        if not of_this_queue(lease, home) or lease.get("job") not in (gpu.get("jobs") or ()):
            out.append(f"lease {lease.get('who') or '?'}")
    for proc in gpu.get("foreign") or ():
        if not proc.get("lease"):
            out.append(render.process_text(proc, unit="G"))
    return out
