"""What each change of state of a job handed to Ray does to its fields (engine/lifecycle/ray_handover.py
makes the changes): pure functions, as core/transitions.py's are for local and Slurm jobs. The `ray`
field holds the hand-over: `address` (the dashboard's URL), `submission_id` (null while the job waits
in ray/ for its dependencies), `state` (Ray's, or WAITING / SUBMITTING of gpuq's own), `reason`,
`exit_code`, `submitted_at`, `log_base` (where this attempt's part of the spool's log begins)."""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core import states
from gpuq.core.job import Job
from gpuq.core.times import now_iso
from gpuq.core.transitions import cancel

Changes = dict[str, Any]
WAITING = "WAITING"  # in ray/, not yet submitted: its dependencies have not all succeeded
SUBMITTING = "SUBMITTING"  # in ray/, the submission asked for but not (yet) known to be taken


def submission_id(nonce: str, job: Job) -> str:
    """Ray's id for the job's next attempt: its id, the attempt and a random `nonce` (another spool,
    or this one made again at the same path, has the same ids). It is written in the job file
    before Ray is asked, so a submission asked twice (a hand-over cut short) is refused by Ray
    rather than run twice."""
    return f"gpuq-{job.id}-{job.attempts + 1}-{nonce}"


def handing(job: Job, address: str, sub_id: Optional[str], log_base: int) -> Changes:
    """pending -> ray: WAITING (sub_id None: its dependencies first) or SUBMITTING."""
    mark = {
        "address": address,
        "submission_id": sub_id,
        "state": SUBMITTING if sub_id else WAITING,
        "reason": None,
        "exit_code": None,
        "submitted_at": now_iso(),
        "log_base": log_base,
    }
    return {
        "ray": mark,
        "ckpt_since": job.ckpt_since or mark["submitted_at"],
        "note": f"handed to the Ray cluster at {address}",
    }


def submitting(job: Job, sub_id: str, log_base: int) -> Changes:
    """ray (WAITING, or a failed attempt to retry) -> ray SUBMITTING under a new submission id."""
    mark = dict(job.ray or {}, submission_id=sub_id, state=SUBMITTING, reason=None, exit_code=None)
    mark.update(log_base=log_base, submitted_at=now_iso())
    return {"ray": mark}


def seen(job: Job, state: str, reason: Optional[str], started_at: Optional[str]) -> Changes:
    """ray -> ray: what Ray (or gpuq, for a waiting job) now says of it."""
    changes: Changes = {"ray": dict(job.ray or {}, state=state, reason=reason)}
    if started_at and not job.started_at:
        changes["started_at"] = started_at
    return changes


def destination(ray_state: str, exit_code: Optional[int]) -> str:
    if ray_state == "SUCCEEDED" and not exit_code:
        return states.DONE
    if ray_state == "STOPPED":
        return states.CANCELLED
    return states.FAILED


def _entry(
    job: Job, ray_state: str, exit_code: Optional[int], outcome: str, times: tuple, reason: Optional[str]
) -> dict:
    return {
        "attempt": job.attempts + 1,
        "started_at": times[0],
        "finished_at": times[1],
        "exit_code": exit_code,
        "signal": None,
        "outcome": outcome,
        "reason": reason,
        "ray_submission_id": (job.ray or {}).get("submission_id"),
        "ray_state": ray_state,
        "mem_mib": job.mem_mib,  # what it had: an out-of-memory retry gets more (core/oom.py)
        **({"gpu_mem_mib": job.gpu_mem_mib} if job.gpu_request else {}),
    }


def ended(
    job: Job,
    ray_state: str,
    *,
    exit_code: Optional[int],
    started_at: Optional[str],
    finished_at: Optional[str],
    reason: Optional[str],
) -> Changes:
    """ray -> done | failed | cancelled: Ray's end, with a history entry."""
    finished_at = finished_at or now_iso()
    started_at = job.started_at or started_at
    outcome = destination(ray_state, exit_code)
    return {
        "ray": dict(job.ray or {}, state=ray_state, reason=None, exit_code=exit_code),
        "started_at": started_at,
        "finished_at": finished_at,
        "exit_code": exit_code,
        "attempts": job.attempts + 1,
        "reason": reason if outcome == states.FAILED else None,
        "note": None,
        "history": [*job.history, _entry(job, ray_state, exit_code, outcome, (started_at, finished_at), reason)],
    }


def retried(job: Job, ray_state: str, *, exit_code: Optional[int], times: tuple, reason: Optional[str]) -> Changes:
    """ray (an attempt failed, retries left) -> ray WAITING to be submitted again: the history keeps the
    failed attempt; the next attempt resumes from the newest checkpoint since the hand-over."""
    entry = _entry(job, ray_state, exit_code, states.PENDING, (job.started_at or times[0], times[1]), reason)
    how = f"with exit {exit_code}" if exit_code is not None else f"({reason or ray_state})"
    return {
        "note": f"attempt {job.attempts + 1} failed {how}; retrying",  # as a local retry's
        "ray": dict(job.ray or {}, state=WAITING, submission_id=None, reason=None, exit_code=exit_code),
        "attempts": job.attempts + 1,
        "started_at": None,
        "previous_exit_code": exit_code,
        "history": [*job.history, entry],
    }


def cancelled(job: Job, note: str, started_at: Optional[str] = None) -> Changes:
    """ray -> cancelled: `gpuq cancel`/`kill` stopped its Ray job (or it was not submitted yet, or
    Ray could not be told). A job that started (`started_at`, as Ray said) gets its attempt's
    history entry, as a local one does."""
    changes = dict(cancel(note), ray=dict(job.ray or {}, state="STOPPED", reason=None))
    started_at = job.started_at or started_at
    if started_at:
        entry = _entry(job, "STOPPED", None, states.CANCELLED, (started_at, changes["finished_at"]), None)
        changes.update(started_at=started_at, attempts=job.attempts + 1, history=[*job.history, entry])
    return changes


def back_to_queue(note: str) -> Changes:
    """ray (WAITING) -> pending: the cluster can never run it; it runs here unless handed over again."""
    return {"ray": None, "note": note}
