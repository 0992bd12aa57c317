"""Crash recovery: bring the spool back to the truth after any crash, at any point.

`reconcile()` is run by every worker step and by `gpuq status`. Each repair is safe to run by
several processes at once: every change to a job is made while holding the job's claim lock, and a
claim whose owner died can be taken over by exactly one process (see Spool.take_over_claim).
spool_layout.md lists each crash point and which repair here resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuq import jobs, procs
from gpuq.spool import STATES, JobRef, Spool


@dataclass
class Report:
    duplicates_removed: list[JobRef] = field(default_factory=list)
    settled: list[tuple[int, str]] = field(default_factory=list)  # (job id, new state)
    stale_claims: list[int] = field(default_factory=list)
    tmp_removed: int = 0


def reconcile(spool: Spool, full: bool = False) -> Report:
    """Repair what crashes leave behind. `full` also resolves duplicate copies and clears stale
    claims and tmp files (the worker does that at start and every few seconds; `gpuq status`
    only needs the cheap part)."""
    report = Report()
    if full:  # meanwhile view.snapshot ignores a stale pending copy and the supervisor re-checks
        resolve_duplicates(spool, report)
    settle_unsupervised(spool, report)
    if full:
        clear_stale_claims(spool, report)
        report.tmp_removed = spool.clean_tmp()
    return report


def resolve_duplicates(spool: Spool, report: Report) -> None:
    """A crash between writing a job's new state and unlinking the old one leaves two copies:
    the copy with the higher rev is the later state and wins."""
    for copies in spool.index().values():
        if len(copies) < 2:
            continue
        loaded = []
        for ref in copies:
            try:
                loaded.append((spool.load(ref)["rev"], STATES.index(ref.state), ref))
            except (FileNotFoundError, jobs.InvalidJob):
                continue
        loaded.sort()
        for _rev, _order, ref in loaded[:-1]:
            spool.remove(ref)
            report.duplicates_removed.append(ref)


def settle_unsupervised(spool: Spool, report: Report) -> None:
    """A running job whose supervisor is gone: if its process is gone too, nobody will ever
    record its end, so move it on now (interrupted, or where a kill request says)."""
    for ref in list(spool.refs(("running",))):
        if spool.claim_held(ref.id):
            continue  # a live supervisor owns it
        claim = spool.take_over_claim(ref.id)
        if claim is None:
            continue  # someone else is settling it right now
        try:
            current = spool.find(ref.id, ("running",))
            if current is None:
                continue
            job = spool.load(current)
            if procs.job_alive(job):
                continue  # still running, unsupervised (supervisor killed, or adopted)
            state, changes = _ending_without_exit_code(spool, job)
            spool.transition(current, job, state, **changes)
            report.settled.append((ref.id, state))
        except (FileNotFoundError, jobs.InvalidJob):
            continue
        finally:
            claim.release()


def _ending_without_exit_code(spool: Spool, job: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    request = spool.take_request(job["id"])
    finished = jobs.now_iso()
    extra: dict[str, Any] = {}
    if request == "kill":
        state, note = "cancelled", "killed by user (gpuq kill); exit code unknown, its supervisor was gone"
    elif request in ("preempt", "preempt-resume"):
        from gpuq.preempt import preemption_record  # lazy: preempt imports queue, which imports us

        extra = preemption_record(spool, job, None, request)
        state, note = "preempted", extra.pop("note") + "; exit code unknown, its supervisor was gone"
    elif job.get("adopted"):
        state, note = "done", "adopted process ended; its exit code cannot be known"
    else:
        state, note = "interrupted", "process and supervisor gone without a recorded exit (reboot or kill)"
    attempt = {
        "attempt": job.get("attempts"),
        "started_at": job.get("started_at"),
        "finished_at": finished,
        "exit_code": None,
        "signal": None,
        "outcome": state,
    }
    return state, {
        "finished_at": finished,
        "exit_code": None,
        "note": note,
        "history": job.get("history", []) + [attempt],
        **extra,
    }


def clear_stale_claims(spool: Spool, report: Report) -> None:
    """A claim lock whose owner died (a worker killed between claiming and handing the job to
    its supervisor, or a supervisor killed after moving the job on) is removed; the job itself
    stays where it is, so it is started at most once."""
    running = {ref.id for ref in spool.refs(("running",))}
    for job_id in spool.lock_ids():
        if job_id in running or spool.claim_held(job_id) is not False:
            continue
        claim = spool.take_over_claim(job_id)
        if claim is not None:
            claim.release()
            report.stale_claims.append(job_id)
    for job_id in spool.request_ids():
        if job_id not in running:
            spool.take_request(job_id)  # a kill/preempt note for a job that is no longer running
