"""What the everyday commands do, as a library: the CLI parses and prints, this module acts.

Every change to a job is made while holding its claim, so it cannot race a worker starting it.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from gpuq import jobs, procs, recovery, scheduler
from gpuq.spool import FINISHED, STATES, JobRef, Spool
from gpuq.view import finished_summaries, recent_finished, snapshot

KILL_GRACE_SECONDS = 10.0


class QueueError(Exception):
    """A request that cannot be carried out; the message is one line for the user."""


def get(spool: Spool, job_id: int, states: tuple[str, ...] = STATES) -> tuple[JobRef, dict[str, Any]]:
    ref = spool.find(job_id, states)
    if ref is None:
        anywhere = spool.find(job_id)
        if anywhere is None:
            raise QueueError(f"no such job #{job_id}")
        raise QueueError(f"job #{job_id} is {anywhere.state}, not {' or '.join(states)}")
    try:
        return ref, spool.load(ref)
    except FileNotFoundError:
        raise QueueError(f"job #{job_id} changed state while reading it; try again") from None
    except jobs.InvalidJob as exc:
        raise QueueError(f"job #{job_id}: file is damaged: {exc}") from None


@contextmanager
def claimed(spool: Spool, job_id: int, states: tuple[str, ...]) -> Iterator[tuple[JobRef, dict[str, Any]]]:
    claim = spool.take_over_claim(job_id)
    if claim is None:
        state = (spool.find(job_id) or JobRef(job_id, "unknown", "")).state
        raise QueueError(f"job #{job_id} is busy ({state}: being started or changed); try again")
    try:
        yield get(spool, job_id, states)
    finally:
        claim.release()


def cancel(spool: Spool, job_id: int) -> dict[str, Any]:
    """A job that is not running (pending, preempted, interrupted) goes to cancelled/."""
    if spool.find(job_id, ("running",)):
        raise QueueError(f"job #{job_id} is running; use `gpuq kill {job_id}`")
    with claimed(spool, job_id, ("pending", "preempted", "interrupted")) as (ref, job):
        return spool.transition(ref, job, "cancelled", note="cancelled by user", finished_at=jobs.now_iso())[1]


def kill(spool: Spool, job_id: int, grace: float = KILL_GRACE_SECONDS) -> dict[str, Any]:
    """SIGTERM the running job's process group, SIGKILL after `grace`; it ends in cancelled/."""
    ref, job = get(spool, job_id, ("running",))
    deadline = time.monotonic() + 5
    while job.get("pid") is None and time.monotonic() < deadline:  # its supervisor is starting it
        time.sleep(0.05)
        ref, job = get(spool, job_id, ("running",))
    spool.request(job_id, "kill")
    if not procs.terminate_tree(job, grace, force=True):
        raise QueueError(f"job #{job_id} (pid {job.get('pid')}) did not die")
    return wait_until_settled(spool, job_id)


def wait_until_settled(spool: Spool, job_id: int, timeout: float = 10.0) -> dict[str, Any]:
    """After a job's process ended: wait for its supervisor to record it (or settle it ourselves
    if the supervisor is gone) and return the job in its new state."""
    deadline = time.monotonic() + timeout
    while spool.find(job_id, ("running",)) is not None:
        recovery.settle_unsupervised(spool, recovery.Report())
        if time.monotonic() > deadline:
            raise QueueError(f"job #{job_id} ended but its new state was not recorded within {timeout:.0f}s")
        time.sleep(0.05)
    return get(spool, job_id)[1]


def retry(spool: Spool, job_id: int) -> dict[str, Any]:
    """A failed or cancelled job goes back to pending with the same id, its history kept."""
    with claimed(spool, job_id, ("failed", "cancelled")) as (ref, job):
        return _requeue(spool, ref, job, "retried by user")


def interrupted(spool: Spool) -> list[dict[str, Any]]:
    return [job for _ref, job in spool.load_many("interrupted")]


def recover(spool: Spool, ids: Optional[list[int]] = None) -> list[dict[str, Any]]:
    """Interrupted jobs (all, or `ids`) go back to pending, keeping id, dependencies and history."""
    targets = ids if ids is not None else [job["id"] for job in interrupted(spool)]
    out = []
    for job_id in targets:
        with claimed(spool, job_id, ("interrupted",)) as (ref, job):
            out.append(_requeue(spool, ref, job, "recovered after interruption"))
    return out


def _requeue(spool: Spool, ref: JobRef, job: dict[str, Any], note: str) -> dict[str, Any]:
    return spool.transition(
        ref,
        job,
        "pending",
        note=note,
        attempts=0,
        started_at=None,
        finished_at=None,
        pid=None,
        pid_create_time=None,
        supervisor=None,
        slot=None,
        exit_code=None,
        signal=None,
        previous_exit_code=job.get("exit_code"),
    )[1]


@dataclass
class ClearReport:
    removed: list[int] = field(default_factory=list)
    kept_for_dependents: list[int] = field(default_factory=list)


def clear(spool: Spool) -> ClearReport:
    """Remove finished jobs (done, failed, cancelled) and their logs. A finished job that a
    waiting job still depends on is kept, so the dependent is not stranded."""
    snap, _ = snapshot(spool)
    needed = {d for j in snap.pending + snap.running for d in j.get("after", []) + j.get("after_any", [])}
    report = ClearReport()
    for ref in list(spool.refs(FINISHED)):
        if ref.id in needed:
            report.kept_for_dependents.append(ref.id)
            continue
        claim = spool.take_over_claim(ref.id)
        if claim is None:
            continue
        try:
            if spool.find(ref.id, (ref.state,)) == ref:
                spool.remove(ref)
                spool.delete_log(ref.id)
                report.removed.append(ref.id)
        finally:
            claim.release()
    return report


# ---- status -----------------------------------------------------------------------------------
@dataclass
class Row:
    job: dict[str, Any]
    state: str
    wait: Optional[scheduler.Wait] = None
    estimate: Optional[Any] = None  # eta.Estimate for running and pending rows
    cells: Optional[tuple] = None  # a finished row's display cells from the cache; `job` is then {"id": ...}


class CachedRow:
    """A finished job's row from the cache of display cells (view.finished_summaries): only the
    id of its job is known. A plain class: 100,000 dataclass rows cost a quarter of a second."""

    __slots__ = ("job", "state", "cells")
    wait = None
    estimate = None

    def __init__(self, job_id: int, state: str, cells: tuple) -> None:
        self.job, self.state, self.cells = {"id": job_id}, state, cells


@dataclass
class Status:
    workers: list[dict[str, Any]]
    rows: list[Row]
    hidden_finished: int = 0
    invalid: list[tuple[JobRef, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


RECENT_FINISHED = 10


def status(
    spool: Spool, show_all: bool = False, summarize: Optional[Callable[[dict[str, Any], str], tuple]] = None
) -> Status:
    """Every row of the queue. With `summarize` (render.finished_cells), a long list of finished
    jobs comes from the cache of their display cells instead of their files (see view.py)."""
    listing = _reconciled_listing(spool)  # a dead job is shown as interrupted as soon as anyone looks
    snap, invalid = snapshot(spool, refs=listing)
    rows = [Row(j, "running") for j in snap.running]
    reasons = scheduler.waiting_reasons(snap)
    rows += [Row(j, "pending", reasons[j["id"]]) for j in scheduler.queue_order(snap.pending)]
    for state in ("preempted", "interrupted"):
        rows += [Row(j, state) for _r, j in spool.load_many(state)]
    finished = recent_finished(spool, 0 if show_all else RECENT_FINISHED, refs=listing)
    hidden = sum(1 for s in snap.states.values() if s in FINISHED) - len(finished)
    if summarize is not None and len(finished) > RECENT_FINISHED:
        rows += [CachedRow(ref.id, ref.state, cells) for ref, cells in finished_summaries(spool, finished, summarize)]
        finished = []
    for ref in finished:
        try:
            rows.append(Row(spool.load(ref), ref.state))
        except (FileNotFoundError, jobs.InvalidJob):
            continue
    rows.sort(key=lambda r: (r.state not in ("running", "pending"), r.job["id"]))
    workers = spool.live_workers()
    from gpuq import eta  # progress and ETA of running jobs, expected start of pending ones

    eta.annotate(spool, rows, workers, time.time())
    return Status(workers, rows, hidden, invalid, spool.dropped_files())


def _reconciled_listing(spool: Spool) -> list[JobRef]:
    """recovery.reconcile's repairs, done on a single listing of the whole tree: with 100,000
    finished jobs each listing costs about 0.1 s, and reconcile() alone lists everything twice."""
    listing = list(spool.refs(STATES))
    if len({ref.id for ref in listing}) != len(listing):  # a crash mid-move left two copies
        recovery.resolve_duplicates(spool, recovery.Report())
        listing = list(spool.refs(STATES))
    report = recovery.Report()
    recovery.settle_unsupervised(spool, report)
    if report.settled:
        listing = list(spool.refs(STATES))
    return listing


def stop_workers(spool: Spool, timeout: float = 10.0) -> list[dict[str, Any]]:
    """SIGTERM every live worker and wait for them to exit. Jobs are left running."""
    import signal

    workers = spool.live_workers()
    for info in workers:
        try:
            os.kill(int(info["pid"]), signal.SIGTERM)
        except (ProcessLookupError, KeyError, ValueError):
            pass
    deadline = time.monotonic() + timeout
    while spool.live_workers():
        if time.monotonic() > deadline:
            raise QueueError(f"worker did not stop within {timeout:.0f}s")
        time.sleep(0.05)
    return workers


def running_jobs(spool: Spool) -> list[dict[str, Any]]:
    return [job for _ref, job in spool.load_many("running")]
