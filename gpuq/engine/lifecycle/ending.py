"""A job's end, recorded: the one way a job that ran leaves running/ (or slurm/) (spool_layout.md,
sections 6, 10 and 16): made by `attempt_end`, written by `record_end`, under the job's claim."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Optional

from gpuq.core import failure, oom, schema, transitions
from gpuq.core.errors import Damaged, Refused
from gpuq.core.job import Job
from gpuq.core.states import FINISHED, PENDING, PREEMPT, PREEMPTED, STATES
from gpuq.core.times import iso_of, parse_iso
from gpuq.engine.tracking import continuation
from gpuq.spool import JobRef, Spool, SpoolFull

FULL_RETRY_MAX_SECONDS = 30.0  # a full disk: the end is tried again, waiting longer each time up to this


class End(NamedTuple):
    """How an attempt ended, as its recorder knows it."""

    state: str  # where the job goes (core/transitions.destination, ended_unseen)
    exit_code: Optional[int]  # None: unknown (its supervisor was gone)
    signal: Optional[str] = None  # the signal's name, when one ended it
    note: Optional[str] = None  # why; for a preemption, said after the preemption's own record
    reason: Optional[str] = None  # why it failed, from its log (core/failure.py)
    finished_at: Optional[str] = None  # None: now
    preempt_action: str = PREEMPT  # for state PREEMPTED: the request (preempt, or preempt-resume)
    preempted_by: Optional[str] = None  # for state PREEMPTED: who, when not the user or an urgent job


def attempt_end(spool: Spool, job: Job, end: End) -> dict[str, Any]:
    """The changes an attempt's end writes: its history entry; back to the queue, how it continues;
    preempted, the preemption's record."""
    how = continuation.plan(spool, job) if end.state == PENDING else None
    note = end.note
    if how is not None:
        note = f"{note}; {how.text()}" if note else how.text()
    changes = transitions.end_attempt(
        job, end.state, exit_code=end.exit_code, signal=end.signal, note=note, continuation=how,
        reason=end.reason, finished_at=end.finished_at,
    )  # fmt: skip
    if end.state == PREEMPTED:
        record = continuation.record_preemption(spool, job, end.exit_code, end.preempt_action, by=end.preempted_by)
        changes.update(record, note=f"{record['note']}; {note}" if note else record["note"])
        changes["history"][-1]["note"] = changes["note"]
    return changes


def record_end(
    spool: Spool,
    ref: JobRef,
    job: Job,
    state: str,
    changes: dict[str, Any],
    *,
    while_full: Optional[Callable[[], None]] = None,
) -> tuple[JobRef, Job]:
    """Move the ended job (its claim held) to `state`. Should a full disk make it fail even with the
    emergency room, `while_full` (if given) is called and the move tried again, waiting longer each time."""
    delay = 1.0
    while True:
        try:
            return move(spool, ref, job, state, changes)
        except SpoolFull:
            if while_full is None:
                raise
            while_full()
            time.sleep(delay)
            delay = min(FULL_RETRY_MAX_SECONDS, delay * 2)


def move(
    spool: Spool, ref: JobRef, job: Job, state: str, changes: dict[str, Any], keep_old: bool = False
) -> tuple[JobRef, Job]:
    """spool.jobs.move, then `landed`; a file that left a finished state is forgotten by the index's
    journal (a later file of that name may get the same inode)."""
    moved = spool.jobs.move(ref, job, state, changes, keep_old=keep_old)
    if ref.state in FINISHED and moved[0] != ref:
        spool.finished.forget(ref)
    landed(spool, moved[0])
    return moved


def landed(spool: Spool, ref: JobRef) -> None:
    """Once a move or publish committed, a finished job's row is noted in the finished index's
    journal (spool/cache/journal.py); here, not in the store, which knows nothing of views."""
    if ref.state in FINISHED:
        spool.finished.note(ref)


def get(spool: Spool, job_id: int, states: tuple[str, ...] = STATES) -> tuple[JobRef, Job]:
    """The job, in one of `states`; Refused (saying where it is) if it is not there or unreadable."""
    ref = spool.jobs.find(job_id, states)
    if ref is None:
        anywhere = spool.jobs.find(job_id)
        if anywhere is None:
            raise Refused(f"no such job #{job_id}")
        raise Refused(f"job #{job_id} is {anywhere.state}, not {' or '.join(states)}")
    try:
        job = spool.jobs.load(ref)
    except FileNotFoundError:
        raise Refused(f"job #{job_id} changed state while reading it; try again") from None
    except schema.InvalidJob as exc:
        raise Damaged(f"job #{job_id}: file is damaged: {exc}") from None
    return spool.jobs.newest_copy(ref, job, states)


def pending_jobs(spool: Spool, ids: Optional[Sequence[int]], left: dict[int, str]) -> list[Job]:
    """The pending jobs to hand over to a cluster (all of them for None); a job named that is not
    pending goes into `left`, with why."""
    if ids is None:
        return [job for _ref, job in spool.jobs.load_many(PENDING)]
    jobs = []
    for job_id in dict.fromkeys(ids):
        try:
            jobs.append(get(spool, job_id, (PENDING,))[1])
        except Refused as exc:
            left[job_id] = str(exc)
    return jobs


@contextmanager
def claimed(spool: Spool, job_id: int, states: tuple[str, ...]) -> Iterator[tuple[JobRef, Job]]:
    """The job (in one of `states`) with its claim held for the block; Refused if someone else
    holds it (a worker starting it, another command) or the job is elsewhere."""
    claim = spool.claims.take_over(job_id)
    if claim is None:
        get(spool, job_id, states)  # a running job's supervisor holds its claim: say where the job is
        raise Refused(f"job #{job_id} is busy (being started or changed); try again")
    try:
        yield get(spool, job_id, states)
    finally:
        claim.release()


def unseen_end(spool: Spool, job: Job) -> Optional[str]:
    """When a job that ended unseen last showed life: the newest write to its log or progress file,
    never before its start nor after now; None (now) with neither. The first look after a reboot
    may come hours after its death: that time never ran."""
    _tail, log_mtime = spool.logs.tail(job, 0)
    report = spool.reports.read_progress(job.id)
    seen = max(log_mtime, report[1] if report else 0.0)
    if not seen:
        return None
    return iso_of(min(time.time(), max(seen, parse_iso(job.started_at) or seen)))


def unseen_oom(spool: Spool, job: Job) -> Optional[tuple[str, oom.Growth]]:
    """For a GPU job that ended unseen with its log showing its GPU out of memory: that reason, and
    the larger share its supervisor would have given (core/oom.py; host memory is its watch's alone)."""
    if not job.gpus or not job.gpu_request:
        return None  # it held no GPU: no GPU share to grow
    tail, _mtime = spool.logs.tail(job, failure.TAIL_BYTES)
    reason = failure.reason(tail, None, None)
    if not oom.gpu_oom(reason):
        return None
    from gpuq.system import gpus  # the GPUs' sizes: only for a job that ran out of GPU memory

    sizes = [gpu.memory_total_mib for gpu in gpus.look().gpus]
    grown = oom.grow(job, reason, None, max(sizes) if sizes else None, None)
    return (str(reason), grown) if grown else None
