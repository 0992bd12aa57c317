"""Crash recovery: bring the spool back to the truth after any crash, at any point (spool_layout.md,
section 10, lists each crash point and its repair). Each repair is safe to run by several processes
at once: every change to a job is made under its claim, which exactly one process can take over.
"""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import INTERRUPTED, PENDING, PREEMPT, PREEMPT_ACTIONS, PREEMPT_RESUME, RUNNING, STATES
from gpuq.spool import JobRef, Spool
from gpuq.system import procs
from gpuq.system.security import FULL_ERRNOS


class Report:
    """What reconcile() repaired."""

    def __init__(self) -> None:
        self.duplicates_removed: list[JobRef] = []
        self.settled: list[tuple[int, str, bool]] = []  # (job id, new state, whether adopted)
        self.stale_claims: list[int] = []
        self.unsettled: list[int] = []  # ended unseen, but the disk had no room to record it
        self.tmp_removed = 0
        self.listing: list[JobRef] = []  # the tree after the repairs, if asked


def reconcile(
    spool: Spool,
    full: bool = False,
    listing: Optional[list[JobRef]] = None,
    finished: Optional[tuple[dict[int, str], int]] = None,
) -> Report:
    """Always: duplicates seen in `listing` and running jobs whose process and supervisor are gone;
    with `full`, every duplicate, stale claims and tmp files. `report.listing`: the tree after the
    repairs. `finished`: (id -> state, file count) of finished jobs when `listing` lacks them."""
    report = Report()
    if full or (listing is not None and _copies(listing, finished)):
        resolve_duplicates(spool, report)  # meanwhile read_queue() ignores a stale pending copy
    settle_unsupervised(spool, report)
    if full:
        clear_stale_claims(spool, report)
        report.tmp_removed = spool.files.clean_tmp()
        spool.snapshots.clean_partial()  # an `add --snapshot` killed mid-copy
    if listing is not None:
        changed = report.duplicates_removed or report.settled
        report.listing = list(spool.jobs.refs(STATES)) if changed else listing
    return report


def _copies(listing: list[JobRef], finished: Optional[tuple[dict[int, str], int]]) -> bool:
    """Whether some job has more than one file in the tree."""
    ids = {ref.id for ref in listing}
    if len(ids) != len(listing):
        return True
    if finished is None:
        return False
    states, files = finished
    return len(states) != files or any(i in states for i in ids)


def resolve_duplicates(spool: Spool, report: Report) -> None:
    """Of two copies a crash left, the higher rev wins. A pending copy no crash can have left
    (another job's, or one put back by hand) goes to rejected/ with the reason, never deleted."""
    for copies in spool.jobs.index().values():
        if len(copies) < 2:
            continue
        loaded = []
        for ref in copies:
            try:
                loaded.append((spool.jobs.load(ref), STATES.index(ref.state), ref))
            except (FileNotFoundError, schema.InvalidJob):
                continue
        if not loaded:
            continue
        loaded.sort(key=lambda copy: (copy[0].rev, copy[1]))
        kept = loaded[-1]
        placed = [copy for copy in loaded if copy[2].state != PENDING]
        if kept[2].state == PENDING and placed and kept[0].created_at != placed[-1][0].created_at:
            kept = placed[-1]  # a newer rev of another job does not replace this one
        for job, _order, ref in loaded:
            if ref == kept[2]:
                continue
            why = _put_back(spool, ref, job, kept[2], kept[0]) if ref.state == PENDING else ""
            if why:
                try:
                    spool.dropbox.reject(ref.name, why)
                except FileNotFoundError:
                    continue  # another repair took it
            else:
                spool.jobs.remove(ref)
            report.duplicates_removed.append(ref)


def _put_back(spool: Spool, ref: JobRef, job: Job, kept: JobRef, kept_job: Job) -> str:
    """Why a pending copy that lost to `kept` is not a crash's leftover ("" if it may be one): a
    leftover is the same job with a lower rev, written before the copy that replaced it."""
    if job.created_at != kept_job.created_at:
        return (
            f"id {ref.id} is already job #{ref.id} in {kept.state}/ here: this file (from another queue?)"
            " holds an id given out before; queue it with `gpuq add`"
        )
    if job.rev >= kept_job.rev or spool.jobs.written_ns(ref) > spool.jobs.written_ns(kept):
        return (
            f"job #{ref.id} is in {kept.state}/ already: a copy put back in pending/ is not run again;"
            f" `gpuq retry {ref.id}` (a failed or cancelled job) or `gpuq add` runs it again"
        )
    return ""


def settle_unsupervised(spool: Spool, report: Report) -> None:
    """Running jobs whose supervisor and process are gone: ended now (interrupted, or as a control
    request says)."""
    for ref in list(spool.jobs.refs((RUNNING,))):
        if spool.claims.held(ref.id):
            continue  # a live supervisor owns it
        noted = spool.claims.noted(ref.id)  # before the take-over replaces a missing lock
        claim = spool.claims.take_over(ref.id)
        if claim is None:
            continue  # someone else is settling it right now
        try:
            current = spool.jobs.find(ref.id, (RUNNING,))
            if current is None:
                continue
            job = spool.jobs.load(current)
            if procs.job_alive(job):
                continue  # still running, unsupervised (supervisor killed, or adopted)
            state = end_unseen(spool, current, job, noted)
            report.settled.append((ref.id, state, job.adopted))
        except (FileNotFoundError, schema.InvalidJob):
            continue
        except OSError as exc:
            if exc.errno not in FULL_ERRNOS:
                raise
            if noted is not None:  # the disk is still full: the lock file keeps the note for a later look
                claim.detach()
            report.unsettled.append(ref.id)
        finally:
            claim.release()


def end_unseen(spool: Spool, ref: JobRef, job: Job, noted: Optional[dict[str, Any]] = None) -> str:
    """Record the end of a running job whose supervisor and process are gone (its claim held); its
    new state. `noted`: what the supervisor left in the claim's lock when the disk was full."""
    # here: `gpuq status` runs reconcile() every time and settles a job almost never (these three)
    from gpuq.core import oom, transitions  # (see above)
    from gpuq.engine.lifecycle import ending  # (see above)
    from gpuq.engine.tracking import continuation  # (see above)

    request = spool.control.take(job.id)
    oomed, ended = None, ending.unseen_end(spool, job)
    if noted and isinstance(noted.get("exit_code"), int) and noted.get("state") in STATES:
        state, code = noted["state"], noted["exit_code"]
        note = f"exit {code}, noted by its supervisor while the disk was full (it died before it could record it)"
        # its supervisor had taken the request of a preemption: the note says whose it was
        action = PREEMPT_RESUME if noted.get("auto_resume") is True else PREEMPT
        by = noted.get("by") if isinstance(noted.get("by"), str) else None
        end = ending.End(state, code, note=note, preempt_action=action, preempted_by=by, finished_at=ended)
    else:
        state, note = transitions.ended_unseen(job, request)
        reached = continuation.reached_end(spool, job) if state == INTERRUPTED else None
        if reached:  # killed as it completed: said, so that recovery does not run it again unasked
            note = f"{note}; {reached_end_text(reached)}"
        oomed = ending.unseen_oom(spool, job) if state == INTERRUPTED and not reached else None
        reason = oomed[0] if oomed else None
        if oomed and oom.retry_left(job):  # its supervisor would have sent it back with more room
            state, note = PENDING, f"attempt {job.attempts}: {reason}; {oom.note(oomed[1])} (its supervisor was gone)"
        elif oomed:
            note = f"{note}; its log shows {reason}: `gpuq recover` runs it again with {oomed[1].text}"
        action = request if request in PREEMPT_ACTIONS else PREEMPT
        end = ending.End(state, None, note=note, reason=reason, preempt_action=action, finished_at=ended)
    changes = ending.attempt_end(spool, job, end)
    if state == PENDING and oomed:
        changes.update(oom.retry(job, oomed[1]))
        changes["history"][-1]["change"] = oom.note(oomed[1])
    ending.record_end(spool, ref, job, state, changes)
    return state


def reached_end_text(reached: str) -> str:
    """What an interrupted job that had reached its end (`step 10/10`) says of it."""
    return f"reached its end: {reached}; exit code unknown"


def clear_stale_claims(spool: Spool, report: Report) -> None:
    """Remove claim locks whose owner died; the job stays where it is, so it starts at most once."""
    running = {ref.id for ref in spool.jobs.refs((RUNNING,))}
    for job_id in spool.claims.ids():
        if job_id in running or spool.claims.held(job_id) is not False:
            continue
        claim = spool.claims.take_over(job_id)
        if claim is not None:
            claim.release()
            report.stale_claims.append(job_id)
    for job_id in spool.control.ids():
        if job_id not in running:
            spool.control.take(job_id)  # a kill/preempt note for a job that is no longer running
