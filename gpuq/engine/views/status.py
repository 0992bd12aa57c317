"""The rows of `gpuq status`: every job with its state, why it waits, and its progress and ETA."""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import time
from typing import Any, Callable, NamedTuple, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import FAILED, FINISHED, HELD, INTERRUPTED, PENDING, PREEMPTED, RAY, RUNNING, SLURM, UNFINISHED
from gpuq.core.times import parse_iso
from gpuq.core.words import cap_text, mib_text
from gpuq.engine.lifecycle import repairs
from gpuq.engine.schedule import diskguard, gpuview, scheduler
from gpuq.engine.schedule.queue_read import read_queue
from gpuq.engine.tracking import gpuuse
from gpuq.spool import JobRef, Spool
from gpuq.spool.cache.index import Finished, FinishedRows
from gpuq.spool.files import MIN_FREE_TO_START
from gpuq.system import procs, security

RECENT_FINISHED = 10
LOOKS = 3  # listings taken at most while jobs keep moving under one `gpuq status`


class Row:
    __slots__ = ("job", "state", "wait", "estimate", "gpu_idle", "disk_wait", "stopping")

    def __init__(self, job: Job, state: str, wait: Optional[scheduler.Wait] = None) -> None:
        self.job, self.state, self.wait = job, state, wait
        # the disk guard's reason, also where another (a dependency, a GPU) is the row's `wait`
        self.disk_wait: Optional[scheduler.Wait] = None
        self.estimate: Any = None  # running and pending rows: engine/tracking/eta.py's Estimate
        self.gpu_idle: list[tuple[int, float]] = []  # a running job's GPUs idle too long: (index, seconds)
        # a running job being killed or preempted (its control request, and when it was made)
        self.stopping: Optional[tuple[str, Optional[float]]] = None


class CachedRow:
    """A row given by its cells (a finished file that is not a valid job): only its id is known."""

    __slots__ = ("job", "state", "cells")
    wait = None
    estimate = None
    disk_wait = None
    stopping = None
    gpu_idle: list[tuple[int, float]] = []

    def __init__(self, job_id: int, state: str, cells: tuple) -> None:
        self.job, self.state, self.cells = Job(id=job_id), state, cells


class Rejected:
    """Dropped files rejected that the user has not seen yet: how many, and the newest one."""

    def __init__(self, count: int, newest: str, reason: str, at: float) -> None:
        self.count, self.newest, self.reason, self.at = count, newest, reason, at


def _row_of(spool: Spool, ref: JobRef, damaged: Optional[Callable[[str, str], Any]]) -> list[Any]:
    """The row of a job outside the queue: [] if it has moved on; a damaged file's row (its cells
    from `damaged`) where the caller shows them, so that no job file goes unseen."""
    try:
        return [Row(spool.jobs.load(ref), ref.state)]
    except FileNotFoundError:
        return []
    except schema.InvalidJob as exc:
        return [CachedRow(ref.id, ref.state, damaged(ref.name, str(exc)))] if damaged is not None else []


class Status(NamedTuple):
    workers: list[dict[str, Any]]
    rows: list[Any]  # Row and CachedRow
    hidden_finished: int
    hidden_failed: int  # of the hidden finished jobs, how many failed
    invalid: list[tuple[JobRef, str]]
    dropped: list[str]
    gpus: Optional[dict[str, Any]]  # engine/schedule/gpuview.py's view; None without GPUs
    warnings: list[str]  # a full disk, a runaway log
    finished: Optional[FinishedRows]  # `status -a`: the finished rows, not in `rows`
    rejected: Optional[Rejected]  # dropped files rejected since `gpuq rejected` last listed them
    hidden_sweeps: dict[int, list[str]]  # sweep id -> the states of its finished jobs not in `rows`

    def outlook(self, now: Optional[float] = None) -> tuple[int, int, int]:
        """The pending jobs as (startable by a worker; later: at their --begin; blocked: by a person)."""
        now = time.time() if now is None else now
        rows = [r for r in self.rows if r.state == PENDING and isinstance(r, Row)]  # not a damaged file
        blocked = sum(1 for r in rows if r.wait is not None and r.wait.forever)
        later = sum(1 for r in rows if not (r.wait and r.wait.forever) and (parse_iso(r.job.begin_at) or 0.0) > now)
        return len(rows) - blocked - later, later, blocked


def status(
    spool: Spool,
    show_all: bool = False,
    damaged: Optional[Callable[[str, str], tuple]] = None,
    recent: int = RECENT_FINISHED,
    finished_view: bool = False,
) -> Status:
    """Every row of the queue. With `damaged` (the CLI's cells of an invalid job file, from its name
    and why) such a file is a row; with `finished_view`, `show_all` gives the finished rows from the
    finished index (`finished`), not as jobs read from their files in `rows` (`status --json`).
    `recent`: how many of the newest finished jobs are rows without `show_all` (`eta`: 0)."""
    warned_slurm = sync_slurm(spool) + sync_ray(spool)
    for _look in range(LOOKS):
        # a dead job is shown as interrupted as soon as anyone looks; one listing serves it all
        listing, done, done_states = _listing(spool)
        finished_jobs, also_elsewhere = len(done_states), [r.id for r in listing if r.id in done_states]
        vanished: list[JobRef] = []
        snap, invalid = read_queue(spool, refs=listing, finished=done_states, vanished=vanished)
        if not vanished:
            break  # else a job started or ended between the listing and its read: look again
    # a job with a copy in a later state too (a crash mid-move) is shown in that state
    finished_jobs -= sum(1 for i in set(also_elsewhere) if snap.states[i] not in FINISHED)
    workers = spool.workers.live()
    rows: list[Any] = [Row(j, RUNNING) for j in snap.running]
    for row in rows:  # one asked to end waits out its grace period (a preempted one saves) in running/
        row.stopping = spool.control.asked(row.job.id, since=parse_iso(row.job.started_at))
        noted = spool.claims.noted(row.job.id)
        if noted and "waiting" in noted:  # it has ended; the disk was too full to record it but in its lock file
            row.job.exit_code, row.job.finished_at = noted.get("exit_code"), noted.get("finished_at")
    views = spool.workers.gpu_views()
    shown = gpuview.current(spool, snap.running, views)  # a look of our own if the workers' is old
    guarded = diskguard.waits(snap.pending)
    reasons = pending_reasons(spool, snap, workers, views, shown, guarded)
    name_the_first_in_line(snap, reasons)
    for job in scheduler.queue_order(snap.pending):
        rows.append(Row(job, PENDING, reasons[job.id]))
        rows[-1].disk_wait = guarded.get(job.id)
    for ref in spool.jobs.refs((HELD, PREEMPTED, INTERRUPTED, SLURM, RAY)):
        rows += _row_of(spool, ref, damaged)
    view = None
    if show_all and finished_view and done.count() > RECENT_FINISHED:
        view = FinishedRows(done.entries)
        finished: list[JobRef] = []
    elif show_all:
        finished = sorted((r for state in FINISHED for r in done.refs(state)), key=lambda r: r.id)
    else:
        finished = done.newest(recent) if recent > 0 else []  # each a job file read
    hidden = 0 if show_all else finished_jobs - len(finished)
    moved_on = {i for i in also_elsewhere if snap.states[i] not in FINISHED and done_states[i] == FAILED}
    hidden_failed = _hidden_failed(done, finished, len(moved_on)) if hidden else 0
    for ref in finished:
        rows += _row_of(spool, ref, damaged)
    sweeps = {r.job.sweep.get("id") for r in rows if isinstance(r.job.sweep, dict)}
    in_rows = {r.job.id for r in rows}
    # the finished jobs of the sweeps in `rows` that are not rows: the hidden ones, or every one
    # where `view` holds them (the web view's sweep lines count them)
    folded = hidden or view is not None
    hidden_sweeps = done.sweep_states({s for s in sweeps if type(s) is int}, in_rows) if folded else {}
    rows.sort(key=lambda r: (r.state not in IN_LINE, r.job.id))  # held ones in their place in line
    for worker in workers:  # one look at each worker's state: a stopped one (Ctrl-Z) starts nothing
        worker["stopped"] = isinstance(worker.get("pid"), int) and procs.stopped(worker["pid"])
    if any(r.state in (RUNNING, PENDING, SLURM, RAY) for r in rows):  # else there is nothing to estimate
        from gpuq.engine.tracking import queue_eta  # the ETA subsystem: only when a job runs or waits

        queue_eta.annotate(spool, rows, workers, time.time(), shown, done)  # progress, ETA, when pending ones start
    warned = warned_slurm + disk_warnings(spool, snap.running) + _idle_gpus(spool, rows)
    if damaged is not None and invalid:  # a damaged file in running/ or pending/ is a row, as in every state
        rows += [CachedRow(ref.id, ref.state, damaged(ref.name, why)) for ref, why in invalid]
        rows.sort(key=lambda r: (r.state not in IN_LINE, r.job.id))
    dropped, others = spool.dropbox.foreign()
    left = "not taken in (only *.json files are jobs); left alone"
    warned += [f"pending/{security.display(name)}: {left}" for name in others]
    rejected = unseen_rejected(spool)
    return Status(workers, rows, hidden, hidden_failed, invalid, dropped, shown, warned, view, rejected, hidden_sweeps)


IN_LINE = (RUNNING, PENDING, HELD)  # the rows shown first, by id; the others come after them


def pending_reasons(
    spool: Spool,
    snap: scheduler.QueueState,
    workers: list[dict[str, Any]],
    views: list[dict[str, Any]],
    shown: Optional[dict[str, Any]],
    guarded: Optional[dict[int, scheduler.Wait]] = None,
) -> dict[int, Optional[scheduler.Wait]]:
    """Why each pending job waits, as status and show say it. While every worker drains, none of them
    starts: that is said instead of a GPU, a --begin time or a running dependency (which would end),
    only a job blocked for good keeping its own reason."""
    reasons = scheduler.waiting_reasons(snap, known_waits(spool, snap, workers, views, shown, guarded))
    if workers and all(worker.get("draining") for worker in workers):
        drain = scheduler.Wait(scheduler.DRAINING, False)
        reasons = {i: w if w is not None and w.forever else drain for i, w in reasons.items()}
    return reasons


def known_waits(
    spool: Spool,
    snap: scheduler.QueueState,
    workers: list[dict[str, Any]],
    views: list[dict[str, Any]],
    shown: Optional[dict[str, Any]],
    guarded: Optional[dict[int, scheduler.Wait]] = None,
) -> dict[int, scheduler.Wait]:
    """What holds pending jobs beside the scheduler's own reasons, the later ones winning."""
    waits: dict[int, scheduler.Wait] = {}
    ids = [job.id for job in snap.pending]
    waits.update(diskguard.waits(snap.pending) if guarded is None else guarded)  # the caller's, if it has them
    free = spool.disk_space()[1]
    if free < MIN_FREE_TO_START and ids:  # on a full disk a worker starts nothing
        full = scheduler.Wait(f"{diskguard.WAITING}: the spool's filesystem has {free // 1024} KiB free", False)
        waits.update(dict.fromkeys(ids, full))
    cap = shown.get("max_gpus") if shown else None
    if isinstance(cap, int) and not isinstance(cap, bool):  # more GPUs than the policy's cap: for good
        too_many = [job for job in snap.pending if job.gpu_request > cap]
        waits.update({job.id: scheduler.Wait(cap_text(cap, job.gpu_request), True) for job in too_many})
    for view in views:  # what the workers last said the GPUs hold back
        waiting = view.get("waiting")
        for key, wait in waiting.items() if isinstance(waiting, dict) else ():
            if key.isdigit() and isinstance(wait, dict) and isinstance(wait.get("reason"), str):
                waits[int(key)] = scheduler.Wait(wait["reason"], wait.get("forever") is True)
    return waits


def _idle_gpus(spool: Spool, rows: list[Any]) -> list[str]:
    """Running jobs whose GPU was idle longer than GPUQ_GPU_IDLE_MINUTES: marked, and a line each."""
    limit, lines = gpuuse.idle_limit_seconds(), []
    for row in rows:
        if row.state == RUNNING and row.job.gpus:
            row.gpu_idle = gpuuse.idle_now(spool.reports.read_gpu_use(row.job.id), row.job.attempts, limit)
            if row.gpu_idle:
                lines.append(f"job {row.job.id} ({row.job.name}): {gpuuse.idle_text(row.gpu_idle)}")
    return lines


def _hidden_failed(done: Finished, shown: list[JobRef], moved_on: int) -> int:
    """Failed jobs the rows leave out: failed/'s less those shown and `moved_on` (copies a crash left)."""
    failed = len(done.ids(FAILED))
    return max(0, failed - sum(1 for r in shown if r.state == FAILED) - moved_on) if failed else 0


def unseen_rejected(spool: Spool) -> Optional[Rejected]:
    """The rejected files `gpuq rejected` has not listed yet."""
    box = spool.dropbox
    unseen = box.unseen(box.rejected())
    if not unseen:
        return None
    at, newest = max((box.rejected_at(name), name) for name in unseen)
    return Rejected(len(unseen), newest, box.reason(newest), at)


def rejected_files(spool: Spool) -> list[tuple[str, float, str]]:
    """`gpuq rejected`: (name, when, why) of every rejected file, oldest first; marked seen."""
    box = spool.dropbox
    names = box.rejected()
    listed = sorted(((name, box.rejected_at(name), box.reason(name)) for name in names), key=lambda r: (r[1], r[0]))
    if names:
        box.mark_seen(names)
    return listed


def name_the_first_in_line(snap: scheduler.QueueState, reasons: dict[int, Optional[scheduler.Wait]]) -> None:
    """A job waiting behind the first in line for a GPU: its reason says what that job needs."""
    jobs = {job.id: job for job in snap.pending}
    for job_id, wait in reasons.items():
        if wait is None or not wait.reason.startswith(scheduler.BEHIND):
            continue
        head_id = wait.reason[len(scheduler.BEHIND) :].split(" ", 1)[0]
        head = jobs.get(int(head_id)) if head_id.isdigit() else None
        if head is not None:
            text = f"waiting behind #{head.id}, first in line for a GPU: it needs {_request_text(head)}"
            reasons[job_id] = scheduler.Wait(text, wait.forever)


def _request_text(job: Job) -> str:
    """`40.0 GiB on a GPU`, `2 whole GPUs`."""
    count, mem = job.gpu_request, job.gpu_mem_mib
    if mem is None:
        return "a whole GPU" if count == 1 else f"{count} whole GPUs"
    return f"{mib_text(mem)} on a GPU" if count == 1 else f"{mib_text(mem)} on each of {count} GPUs"


def _listing(spool: Spool) -> tuple[list[JobRef], Finished, dict[int, str]]:
    """After the cheap repairs: the refs of the unfinished states, the finished index, its states."""
    for _attempt in range(2):  # a repair moved files: listed again
        # The unfinished states first: a job that ends between the two listings is then seen in
        # running/ or in done/ (it only moves forward), never in neither.
        listing = list(spool.jobs.refs(UNFINISHED))
        done = spool.finished.read()
        done_states = done.states()  # handed over to the snapshot, which adds the other states
        report = repairs.reconcile(spool, listing=listing, finished=(done_states, done.count()))
        if not (report.duplicates_removed or report.settled):
            break
    return listing, done, done_states


def sync_slurm(spool: Spool) -> list[str]:
    """With jobs in slurm/ (only then: the client imports subprocess), record Slurm's word on them."""
    if not spool.jobs.names(SLURM):
        return []
    from gpuq.engine.lifecycle import slurm_handover  # the Slurm subsystem: only with jobs handed to it

    try:
        slurm_handover.sync(spool)
    except slurm_handover.SlurmError as exc:
        return [f"Slurm's state of the jobs handed to it is not current: {exc}"]
    return []


def sync_ray(spool: Spool) -> list[str]:
    """With jobs in ray/ (only then: the client imports urllib), record Ray's word on them, submit more."""
    if not spool.jobs.names(RAY):
        return []
    from gpuq.engine.lifecycle import ray_handover  # the Ray subsystem: only with jobs handed to it

    try:
        ray_handover.sync(spool)
    except ray_handover.RayError as exc:
        return [f"Ray's state of the jobs handed to it is not current: {exc}"]
    return []


LOW_SPACE_FRACTION = 0.05  # status warns below 5% free on the spool's filesystem
BIG_LOG_BYTES = 1 << 30  # and when a running job's log passes this (no cap by default)


def disk_warnings(spool: Spool, running: list[Job]) -> list[str]:
    """A spool filesystem running out of room, a log past BIG_LOG_BYTES, an end waiting for room."""
    out = []
    total, free = spool.disk_space()
    if total and free < LOW_SPACE_FRACTION * total:
        out.append(
            f"disk {'full' if free < (1 << 20) else 'nearly full'}: the spool's filesystem has "
            f"{free / total:.0%} free ({free >> 20} MiB); `gpuq clear --logs` drops finished jobs' logs"
        )
    for job in running:
        size = spool.logs.size(job)
        if size > BIG_LOG_BYTES and not job.max_log_bytes:
            out.append(
                f"job #{job.id}'s log is {size / (1 << 30):.1f} GiB and has no cap "
                "(`gpuq add --max-log-size 1G`, or `gpuq run --max-log-size 1G` for every job)"
            )
        if job.exit_code is not None:  # its end noted in the lock file (see status()), not yet recorded
            gone = not spool.claims.held(job.id)
            who = "its supervisor is gone; the next look records it" if gone else "its supervisor records it"
            out.append(f"job #{job.id} ended (exit {job.exit_code}): the disk is full, {who} as soon as there is room")
    return out
