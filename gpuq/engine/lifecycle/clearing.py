"""`gpuq clear`: remove finished jobs and their logs, keeping what `gpuq history` counts and what
the ETA learns from them: before a job's file goes, its record is appended to the spool's
`kept-runs`, synced. On a full disk the logs go first, which makes the room the records need.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuq.core import schema
from gpuq.core.states import DONE, FINISHED, UNFINISHED
from gpuq.engine.tracking import eta
from gpuq.spool import JobRef, Spool, SpoolFull
from gpuq.spool.cache import runs

BATCH = 256  # jobs whose claims are held at once while their records are kept and their files removed


@dataclass
class Selection:
    refs: list[JobRef] = field(default_factory=list)
    kept_for_dependents: list[int] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {state: n for state in FINISHED if (n := sum(ref.state == state for ref in self.refs))}


@dataclass
class ClearReport:
    removed: list[int] = field(default_factory=list)
    kept_for_dependents: list[int] = field(default_factory=list)
    logs_dropped: list[int] = field(default_factory=list)
    no_room: list[int] = field(default_factory=list)  # left: no room on the disk to keep their records
    freed_bytes: int = 0


def select(
    spool: Spool, states: tuple[str, ...] = FINISHED, older_than: Optional[float] = None, now: Optional[float] = None
) -> Selection:
    """Less those an unfinished job (held, preempted, ... too: each may be queued again) waits for.
    A job whose end is unknown is not old."""
    if any(state not in FINISHED for state in states):
        raise ValueError(f"only finished jobs are cleared ({', '.join(FINISHED)}), not {states}")
    now = time.time() if now is None else now
    needed = {d for state in UNFINISHED for _ref, j in spool.jobs.load_many(state) for d in j.after + j.after_any}
    chosen = Selection()
    for ref in spool.jobs.refs(states):
        if ref.id in needed:
            chosen.kept_for_dependents.append(ref.id)
        elif older_than is None:
            chosen.refs.append(ref)
        else:  # a job gone, or not a job, has no age that can be told: not old
            try:
                job = spool.jobs.load(ref)
            except (FileNotFoundError, schema.InvalidJob):
                continue
            ended = runs.parse_time(job.finished_at) or runs.parse_time(job.created_at)
            if ended is not None and ended < now - older_than:
                chosen.refs.append(ref)
    return chosen


def clear(spool: Spool, chosen: Selection, logs_only: bool = False) -> ClearReport:
    """Remove the jobs of `chosen` still where they were chosen, once their records are kept."""
    report = ClearReport(kept_for_dependents=list(chosen.kept_for_dependents))
    if logs_only:
        for ref in chosen.refs:
            if spool.has_log(ref.id):
                report.logs_dropped.append(ref.id)
                report.freed_bytes += spool.delete_log(ref.id)
        return report
    for start in range(0, len(chosen.refs), BATCH):
        _clear_batch(spool, chosen.refs[start : start + BATCH], report)
    report.freed_bytes += spool.snapshots.release_unused(set(spool.jobs.index()))
    return report


def _clear_batch(spool: Spool, refs: list[JobRef], report: ClearReport) -> None:
    claims, ready = [], []
    try:
        for ref in refs:
            claim = spool.claims.take_over(ref.id, noting=False)  # an empty lock: no room needed on a full disk
            if claim is None:
                continue  # being changed (a retry): left as it is
            claims.append(claim)
            if spool.jobs.find(ref.id, (ref.state,)) == ref:
                ready.append(ref)
        records = [record for record in (record_of(spool, ref) for ref in ready) if record is not None]
        for attempt in range(2 if records else 0):  # appended durably; on a full disk, the jobs' logs go first
            try:
                spool.files.with_room(lambda: spool.kept.append(records))
                break
            except SpoolFull:
                if attempt:
                    report.no_room += [ref.id for ref in ready]
                    return
                for ref in ready:
                    report.freed_bytes += spool.delete_log(ref.id)
        for ref in ready:
            spool.jobs.remove(ref)
            report.freed_bytes += spool.delete_outputs(ref.id)
            report.removed.append(ref.id)
    finally:
        for claim in claims:
            claim.release()


def record_of(spool: Spool, ref: JobRef) -> Optional[tuple[Any, ...]]:
    """What clear keeps of a finished job (spool/kept.py's RECORD), or None for a job that never ran."""
    try:
        job = spool.jobs.load(ref)
    except (FileNotFoundError, schema.InvalidJob):
        return None
    _sweep, adopted, attempts, preempted = runs.facts(ref.state, job)
    run = runs.run_seconds(job)
    tail = None
    if ref.state == DONE and not adopted:
        tail = eta.tail_and_pace(job, spool.reports.read_samples(ref.id))[0]
    if not attempts and not preempted and run is None and tail is None:
        return None
    key = runs.command_key(job.cmd, job.cwd)
    past = runs.past_text(ref.state, job)
    return ref.id, ref.state, job.name, key, run, past, runs.parse_time(job.finished_at), tail
