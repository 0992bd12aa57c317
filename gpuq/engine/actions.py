"""What the everyday commands do, as a library: the CLI parses and prints, this module acts.

Every change to a job is made while holding its claim, so it cannot race a worker starting it.
Refusals raise core.errors.Refused with a one-line message.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from gpuq.core import schema, transitions
from gpuq.core.errors import Refused
from gpuq.core.states import ACTIVE, CANCELLED, FAILED, FINISHED, INTERRUPTED, KILL, PENDING, PREEMPTED, RUNNING, STATES
from gpuq.engine import recovery
from gpuq.engine.snapshot import snapshot
from gpuq.spool import JobRef, Spool
from gpuq.system import procs

KILL_GRACE_SECONDS = 10.0
PID_WAIT_SECONDS = 5.0  # a job just handed to its supervisor gets its pid within milliseconds


def get(spool: Spool, job_id: int, states: tuple[str, ...] = STATES) -> tuple[JobRef, dict[str, Any]]:
    ref = spool.jobs.find(job_id, states)
    if ref is None:
        anywhere = spool.jobs.find(job_id)
        if anywhere is None:
            raise Refused(f"no such job #{job_id}")
        raise Refused(f"job #{job_id} is {anywhere.state}, not {' or '.join(states)}")
    try:
        return ref, spool.jobs.load(ref)
    except FileNotFoundError:
        raise Refused(f"job #{job_id} changed state while reading it; try again") from None
    except schema.InvalidJob as exc:
        raise Refused(f"job #{job_id}: file is damaged: {exc}") from None


@contextmanager
def claimed(spool: Spool, job_id: int, states: tuple[str, ...]) -> Iterator[tuple[JobRef, dict[str, Any]]]:
    """The job (in one of `states`) with its claim held for the block."""
    claim = spool.claims.take_over(job_id)
    if claim is None:
        state = (spool.jobs.find(job_id) or JobRef(job_id, "unknown", "")).state
        raise Refused(f"job #{job_id} is busy ({state}: being started or changed); try again")
    try:
        yield get(spool, job_id, states)
    finally:
        claim.release()


def running_with_pid(spool: Spool, job_id: int) -> tuple[JobRef, dict[str, Any]]:
    """A running job, once its supervisor has recorded its pid if it is starting right now (the
    pid stays null only if the supervisor died in that instant)."""
    ref, job = get(spool, job_id, (RUNNING,))
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while job.get("pid") is None and time.monotonic() < deadline:
        time.sleep(0.05)
        ref, job = get(spool, job_id, (RUNNING,))
    return ref, job


def cancel(spool: Spool, job_id: int) -> dict[str, Any]:
    """A job that is not running (pending, preempted, interrupted) goes to cancelled/."""
    if spool.jobs.find(job_id, (RUNNING,)):
        raise Refused(f"job #{job_id} is running; use `gpuq kill {job_id}`")
    with claimed(spool, job_id, (PENDING, PREEMPTED, INTERRUPTED)) as (ref, job):
        return spool.jobs.move(ref, job, CANCELLED, transitions.cancel())[1]


def kill(spool: Spool, job_id: int, grace: float = KILL_GRACE_SECONDS) -> dict[str, Any]:
    """SIGTERM the running job's process group, SIGKILL after `grace`; it ends in cancelled/."""
    _ref, job = running_with_pid(spool, job_id)
    spool.control.request(job_id, KILL)
    if not procs.terminate_tree(job, grace, force=True):
        raise Refused(f"job #{job_id} (pid {job.get('pid')}) did not die")
    return wait_until_settled(spool, job_id)


def wait_until_settled(spool: Spool, job_id: int, timeout: float = 10.0) -> dict[str, Any]:
    """After a job's process ended: wait for its supervisor to record it (or settle it ourselves
    if the supervisor is gone) and return the job in its new state."""
    deadline = time.monotonic() + timeout
    while spool.jobs.find(job_id, (RUNNING,)) is not None:
        recovery.settle_unsupervised(spool, recovery.Report())
        if time.monotonic() > deadline:
            raise Refused(f"job #{job_id} ended but its new state was not recorded within {timeout:.0f}s")
        time.sleep(0.05)
    return get(spool, job_id)[1]


def retry(spool: Spool, job_id: int) -> dict[str, Any]:
    """A failed or cancelled job goes back to pending with the same id, its history kept."""
    with claimed(spool, job_id, (FAILED, CANCELLED)) as (ref, job):
        return spool.jobs.move(ref, job, PENDING, transitions.requeue(job, "retried by user"))[1]


def interrupted(spool: Spool) -> list[dict[str, Any]]:
    return [job for _ref, job in spool.jobs.load_many(INTERRUPTED)]


def recover(spool: Spool, ids: Optional[list[int]] = None) -> list[dict[str, Any]]:
    """Interrupted jobs (all, or `ids`) go back to pending, keeping id, dependencies and history."""
    targets = ids if ids is not None else [job["id"] for job in interrupted(spool)]
    out = []
    for job_id in targets:
        with claimed(spool, job_id, (INTERRUPTED,)) as (ref, job):
            changes = transitions.requeue(job, "recovered after interruption")
            out.append(spool.jobs.move(ref, job, PENDING, changes)[1])
    return out


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
    for ref in list(spool.jobs.refs(FINISHED)):
        if ref.id in needed:
            report.kept_for_dependents.append(ref.id)
            continue
        claim = spool.claims.take_over(ref.id)
        if claim is None:
            continue
        try:
            if spool.jobs.find(ref.id, (ref.state,)) == ref:
                spool.jobs.remove(ref)
                spool.delete_outputs(ref.id)
                report.removed.append(ref.id)
        finally:
            claim.release()
    return report


def stop_workers(spool: Spool, timeout: float = 10.0) -> list[dict[str, Any]]:
    """SIGTERM every live worker and wait for them to exit. Jobs are left running."""
    workers = spool.workers.live()
    for info in workers:
        try:
            os.kill(int(info["pid"]), signal.SIGTERM)
        except (ProcessLookupError, KeyError, ValueError):
            pass
    deadline = time.monotonic() + timeout
    while spool.workers.live():
        if time.monotonic() > deadline:
            raise Refused(f"worker did not stop within {timeout:.0f}s")
        time.sleep(0.05)
    return workers


def jobs_in(spool: Spool, states: tuple[str, ...] = ACTIVE) -> list[dict[str, Any]]:
    return [job for state in states for _ref, job in spool.jobs.load_many(state)]
