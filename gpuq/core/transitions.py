"""What each change of state does to a job file, as pure functions: the one place each is written.
Each returns the fields to change; the caller applies them under the job's claim (`spool.jobs.move`).

    pending --start--> running --end_attempt--> done | failed | cancelled | preempted | pending (retry)
    running --ended_unseen--> interrupted | cancelled | preempted | done (adopted)   (no supervisor)
    failed | cancelled | interrupted | preempted --requeue / resume--> pending
    pending | held | preempted | interrupted --cancel--> cancelled
    pending --hold--> held --release--> pending
    pending --slurm_submitting--> pending (marked) --hand_over--> slurm --slurm_end--> done | failed | cancelled
    slurm --slurm_seen--> slurm (Slurm's state or reason changed)
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

from gpuq.core import oom, states
from gpuq.core.job import Job
from gpuq.core.resume_arg import resume_argv
from gpuq.core.times import now_iso
from gpuq.core.words import plural

Changes = dict[str, Any]


class Continuation(NamedTuple):
    """How a job that goes back to the queue will go on: from `checkpoint` (its `step`), or from
    scratch (`checkpoint` None). `last_step` is how far the attempt before got, when known."""

    checkpoint: Optional[str] = None
    step: Optional[int] = None
    last_step: Optional[int] = None
    from_scratch: bool = False  # asked for (--from-scratch, --no-resume): a new run begins

    @property
    def lost(self) -> Optional[int]:
        """Steps the interruption cost: done before it minus the checkpoint's (all without one;
        unknown when its name tells no step)."""
        if self.last_step is None or not self.checkpoint:
            return self.last_step
        return max(0, self.last_step - self.step) if self.step is not None else None

    def text(self) -> str:
        """`continues from checkpoint-9000 (lost 212 steps)`, or how it starts over."""
        lost = f" (lost {plural(self.lost, 'step')})" if self.lost is not None else ""
        if self.checkpoint:
            return f"continues from {os.path.basename(self.checkpoint.rstrip('/'))}{lost}"
        return (
            "starts over, as asked" if self.from_scratch else "starts from scratch (no checkpoint of its own)"
        ) + lost


# The fields that describe one run of a job; cleared whenever it goes back to the queue (where it
# runs here unless handed to Slurm or Ray again).
_RUN_FIELDS: Changes = dict.fromkeys(("started_at", "finished_at", "pid", "pid_create_time", "supervisor", "slot"))
_RUN_FIELDS.update(dict.fromkeys(("gpus", "gpu_share", "reason", "code_changed", "code_at_start", "slurm", "ray")))


def start(
    job: Job,
    *,
    slot: Optional[str],
    gpus: Optional[list[int]],
    boot_id: str,
    host: str,
    log: str,
    gpu_share: Optional[float] = None,
) -> Changes:
    """pending -> running, by the job's supervisor (its identity and pid come later). `slot`: its
    CUDA_VISIBLE_DEVICES; `gpus`: the GPU indices it holds; `gpu_share`: how many GPUs' worth (None: all of them)."""
    started = now_iso()
    return {
        "started_at": started,
        "ckpt_since": job.ckpt_since or started,  # the run's own checkpoints are newer than this
        "finished_at": None,
        "pid": None,
        "exit_code": None,
        "signal": None,
        "slot": slot,
        "gpus": gpus,
        "gpu_share": gpu_share,
        "attempts": job.attempts + 1,
        "supervisor": None,
        "boot_id": boot_id,
        "host": host,
        "note": None,
        "log": log,
        "queue_front": False,  # a resumed job is first in line once, not on every later retry
    }


def destination(
    job: Job,
    exit_code: int,
    request: Optional[str],
    retry: bool,
    time_limit: Optional[str] = None,
    *,
    host_memory: Optional[str] = None,
    completed: Optional[str] = None,
) -> tuple[str, Optional[str]]:
    """Where an attempt whose exit code is known goes, and why. A run stopped at its `time_limit` or
    `host_memory` failed whatever its exit code, and is not retried as is (it would reach it again):
    one stopped at its host memory may be, with more (core/oom.py). `completed`: the end of its work
    its progress reached (`step 12/12`); with exit 0 it ended before a request to stop it took
    effect, and is done: preempted, it would only run again from scratch."""
    if completed and exit_code == 0 and request in states.ACTIONS:
        what = "preemption" if request in states.PREEMPT_ACTIONS else request
        return states.DONE, f"ended with its work complete ({completed}) before the {what} took effect"
    if request in states.KILL_ACTIONS:
        return states.CANCELLED, states.KILLED_BY[request]
    if request in states.PREEMPT_ACTIONS:
        why = f"its time limit of {time_limit} was reached" if time_limit else "gpuq preempt"
        return states.PREEMPTED, f"preempted ({why})"
    if time_limit:
        return states.FAILED, f"stopped: its time limit of {time_limit} was reached"
    if host_memory:
        return states.FAILED, f"stopped: its host memory limit of {host_memory} was reached"
    if exit_code == 0:
        return states.DONE, None
    if retry and job.attempts - oom.extra_attempts(job) <= job.retries:
        return states.PENDING, f"attempt {job.attempts} failed with exit {exit_code}; retrying"
    if retry and job.retries:
        return states.FAILED, _gave_up(job)
    return states.FAILED, None


def _gave_up(job: Job) -> str:
    """Why a job with --retries is not retried again: no crash loop, even from a checkpoint."""
    attempts = job.attempts
    earlier = job.history[-(attempts - 1) :] if attempts > 1 else []
    start = job.resumed_from
    same = 1  # the attempts, the last one included, that all started from the same checkpoint
    for entry in reversed(earlier):
        if not start or entry.get("resumed_from") != start:
            break
        same += 1
    where = ""
    if start:
        name = os.path.basename(start.rstrip("/"))
        where = f" from {name}" if same == attempts else f", the last {same} from {name}"
    return f"failed {attempts} times{where}; its --retries ({job.retries}) are used up: not retried again"


def end_attempt(
    job: Job,
    state: str,
    *,
    exit_code: Optional[int],
    signal: Optional[str],
    note: Optional[str],
    finished_at: Optional[str] = None,
    continuation: Optional[Continuation] = None,
    reason: Optional[str] = None,
) -> Changes:
    """running -> `state`: the attempt's end and its history entry. Back to pending (a retry) also
    clears the run's fields and sets how it goes on; the attempt count goes on."""
    finished_at = finished_at or now_iso()
    entry = {
        "attempt": job.attempts,
        "started_at": job.started_at,
        "finished_at": finished_at,
        "exit_code": exit_code,
        "signal": signal,
        "outcome": state,
        "slot": job.slot,
        "gpus": job.gpus,
        "gpu_share": job.gpu_share,
        "resumed_from": job.resumed_from,
        "lost_steps": job.lost_steps,
        "reason": reason,
        "note": note,  # why, as the job's note said it when the attempt ended
        "gpu_mem_mib": job.gpu_mem_mib,  # what it had: an out-of-memory retry gets more (core/oom.py)
        "mem_mib": job.mem_mib,
    }
    changes: Changes = {
        "finished_at": finished_at,
        "exit_code": exit_code,
        "signal": signal,
        "note": note,
        "reason": reason,
        "history": [*job.history, entry],
    }
    if state == states.PENDING:
        changes.update(_RUN_FIELDS)
        changes.update(continue_from(job, continuation or Continuation()))
    return changes


def ended_unseen(job: Job, request: Optional[str]) -> tuple[str, str]:
    """State and note of a running job whose process and supervisor are both gone (exit unknown)."""
    if request in states.KILL_ACTIONS:
        why = "an adopted process has no supervisor" if job.adopted else "its supervisor was gone"
        return states.CANCELLED, f"{states.KILLED_BY[request]}; exit code unknown: {why}"
    if request in states.PREEMPT_ACTIONS:
        if job.adopted:
            return states.PREEMPTED, "an adopted process has no supervisor, so its exit code cannot be known"
        return states.PREEMPTED, "exit code unknown, its supervisor was gone"
    if job.adopted:
        return states.DONE, "adopted process ended; its exit code cannot be known"
    return states.INTERRUPTED, "process and supervisor gone without a recorded exit (reboot or kill)"


def requeue(job: Job, note: str, continuation: Optional[Continuation] = None) -> Changes:
    """failed | cancelled | interrupted | preempted -> pending, by a person: same id and history, a
    fresh count of attempts."""
    changes = {
        **_RUN_FIELDS,
        "note": note,
        "attempts": 0,
        "exit_code": None,
        "signal": None,
        "previous_exit_code": job.exit_code,
    }
    changes.update(continue_from(job, continuation or Continuation()))
    return changes


def continue_from(job: Job, continuation: Continuation) -> Changes:
    """The command and fields of the next attempt: the checkpoint in the job's resume form in place
    of any earlier one (from scratch: none)."""
    changes: Changes = {
        "resumed_from": continuation.checkpoint,
        "resumed_from_step": continuation.step if continuation.checkpoint else None,
        "lost_steps": continuation.lost,
    }
    if continuation.checkpoint is not None or job.resumed_from:
        changes["cmd"] = resume_argv(job.cmd, job.resume_arg, continuation.checkpoint)
    if continuation.from_scratch:
        changes["ckpt_since"] = None  # a new run: its checkpoints are those written from its start
    return changes


def cancel(note: str = "cancelled by user") -> Changes:
    """pending | held | preempted | interrupted -> cancelled."""
    return {"note": note, "finished_at": now_iso()}


def hold() -> Changes:
    """pending -> held: out of the queue, its place (priority, id) kept for its release."""
    return {"note": states.HELD_NOTE}


def release() -> Changes:
    """held -> pending, in line again where its priority and id put it."""
    return {"note": None}


def preemption(
    job: Job,
    *,
    action: str,
    exit_code: Optional[int],
    checkpoint: Optional[str],
    checkpoint_step: Optional[int],
    last_step: Optional[int],
    by: Optional[str] = None,
) -> Changes:
    """running -> preempted: the record of this preemption. Lost steps: the last step reached minus
    the checkpoint's (from scratch without one, or for a `no_resume` job: all; no progress seen: unknown)."""
    starts_over = bool(job.no_resume)  # whatever checkpoints it wrote, its next attempt starts at step 0
    base = 0 if starts_over else checkpoint_step if checkpoint is not None else (None if job.resumed_from else 0)
    # max(0, ...): a save can be newer than the last progress line seen (tqdm refreshes lazily)
    lost = max(0, last_step - base) if last_step is not None and base is not None else None
    record = {
        "at": now_iso(),
        "by": by or ("urgent job" if action == states.PREEMPT_RESUME else "user"),
        "exit_code": exit_code,
        "checkpoint": checkpoint,
        "checkpoint_step": checkpoint_step,
        "last_step": last_step,
        "lost_steps": lost,
        "starts_over": starts_over,
    }
    return {
        "preemptions": [*job.preemptions, record],
        "checkpoint": checkpoint,
        "auto_resume": action == states.PREEMPT_RESUME,
        "note": describe_preemption(record),
    }


def describe_preemption(record: dict[str, Any]) -> str:
    if record.get("starts_over"):
        lost = record.get("lost_steps")
        lost_text = f"lost {plural(lost, 'step')}, all since its start" if lost is not None else "lost all progress"
        return f"preempted by {record.get('by', 'user')}; starts over (--no-resume): {lost_text}"
    where = f"checkpoint {record['checkpoint']}" if record.get("checkpoint") else "no complete checkpoint found"
    text = f"preempted by {record.get('by', 'user')}; {where}"
    if record.get("lost_steps") is not None:
        text += f"; lost {plural(record['lost_steps'], 'step')}: last progress {record['last_step']}"
        text += f", checkpoint {record['checkpoint_step'] or 0}"
    return text


def resume(job: Job, continuation: Continuation, front: bool, note: str) -> Changes:
    """preempted | interrupted -> pending, first in line unless not `front`."""
    changes = requeue(job, note, continuation)
    changes.update(queue_front=front, auto_resume=False)
    return changes


# ---- Slurm (engine/lifecycle/slurm_handover.py) ----


def slurm_submitting(cluster_opts: list[str]) -> Changes:
    """pending -> pending, marked before sbatch is asked: a hand-over cut short is found by this mark
    and repaired from Slurm's side, never submitted twice; the scheduler does not start it."""
    return {
        "slurm": {
            "job_id": None,
            "state": states.SLURM_SUBMITTING,
            "reason": None,
            "submitted_at": now_iso(),
            "cluster_opts": list(cluster_opts),
            "exit_code": None,
        }
    }


def slurm_abandoned() -> Changes:
    """pending (marked) -> pending: Slurm did not take the job; it is an ordinary pending job again."""
    return {"slurm": None}


def hand_over(job: Job, slurm_id: int, state: str = "PENDING") -> Changes:
    """pending (marked) -> slurm as job `slurm_id`; only checkpoints from now on are its to resume."""
    mark = dict(job.slurm or {})
    mark.update(job_id=slurm_id, state=state, reason=None, exit_code=None)
    mark.setdefault("submitted_at", now_iso())
    mark.setdefault("cluster_opts", [])
    return {
        "slurm": mark,
        "ckpt_since": job.ckpt_since or mark["submitted_at"],
        "note": f"handed to Slurm as job {slurm_id}",
    }


def slurm_seen(job: Job, state: str, reason: Optional[str], started_at: Optional[str]) -> Changes:
    """slurm -> slurm: what Slurm now says of the job (its state, why it waits, when it started)."""
    changes: Changes = {"slurm": dict(job.slurm or {}, state=state, reason=reason)}
    if started_at and not job.started_at:
        changes["started_at"] = started_at
    return changes


def slurm_destination(slurm_state: str, exit_code: Optional[int]) -> str:
    """Where a job Slurm finished goes: done (COMPLETED, exit 0), cancelled (CANCELLED), else failed."""
    if slurm_state == "COMPLETED" and exit_code == 0:
        return states.DONE
    if slurm_state == "CANCELLED":
        return states.CANCELLED
    return states.FAILED


def slurm_end(
    job: Job,
    slurm_state: str,
    *,
    exit_code: Optional[int],
    signal: Optional[str],
    started_at: Optional[str],
    finished_at: Optional[str],
    note: Optional[str] = None,
) -> Changes:
    """slurm -> done | failed | cancelled: Slurm's end, with a history entry."""
    finished_at = finished_at or now_iso()
    started_at = job.started_at or started_at
    outcome = slurm_destination(slurm_state, exit_code)
    mark = dict(job.slurm or {}, state=slurm_state, reason=None, exit_code=exit_code)
    entry = {
        "attempt": job.attempts + 1,
        "started_at": started_at,
        "finished_at": finished_at,
        "exit_code": exit_code,
        "signal": signal,
        "outcome": outcome,
        "slurm_job_id": mark.get("job_id"),
        "slurm_state": slurm_state,
    }
    if note is None and slurm_state not in ("COMPLETED", "FAILED", "CANCELLED"):
        note = f"Slurm ended it: {slurm_state}"  # TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED...
    return {
        "slurm": mark,
        "started_at": started_at,
        "finished_at": finished_at,
        "exit_code": exit_code,
        "signal": signal,
        "attempts": job.attempts + 1,
        "note": note,
        "history": [*job.history, entry],
    }


def slurm_cancelled(job: Job, note: str) -> Changes:
    """slurm -> cancelled: `gpuq cancel` asked Slurm to cancel it (scancel), or could not
    (`cancel_here_only`). A job seen running gets its attempt's history entry, as a local one does."""
    mark = dict(job.slurm or {}, state="CANCELLED", reason=None)
    changes = dict(cancel(note), slurm=mark)
    if job.started_at:  # the same entry as Slurm's own end in CANCELLED
        ended = slurm_end(
            job, "CANCELLED", exit_code=None, signal=None, started_at=None, finished_at=changes["finished_at"]
        )
        changes.update(attempts=ended["attempts"], history=ended["history"])
    return changes


FORCE_HINT = "`gpuq cancel --force {id}` records it cancelled here, though it may still run there"


def cancel_here_only(cluster: str, why: str) -> str:
    """The note of a job cancelled here while its cluster could not be told (`gpuq cancel --force`)."""
    return f"{states.HERE_ONLY}: {cluster} could not be told ({why}); the job may still run there"
