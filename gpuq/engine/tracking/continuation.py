"""What an interrupted attempt leaves behind, and how a job queued again continues: from the newest
complete checkpoint it wrote itself, so that a training interrupted at 90% does not start over."""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core import transitions
from gpuq.core.job import Job, is_number
from gpuq.core.transitions import Continuation
from gpuq.engine.tracking import checkpoints, progress
from gpuq.spool import Spool


def plan(spool: Spool, job: Job, from_scratch: bool = False) -> Continuation:
    """How `job` goes on after the attempt it has just ended (or that was interrupted)."""
    last = last_step(spool, job) if job.started_at else None
    if from_scratch or job.no_resume:
        return Continuation(None, None, last, from_scratch=True)
    found = checkpoints.latest_checkpoint(job)
    if found is None:
        return Continuation(None, None, last)
    return Continuation(found.path, found.step, last)


def last_step(spool: Spool, job: Job) -> Optional[int]:
    """The furthest step the current attempt reported: its progress file or its log."""
    report = progress.progress_report(spool, job)
    reported = report[0].get("step") if report else None
    logged = progress.last_step(progress.log_tail(spool, job, progress.TAIL_BYTES)[0])
    steps = [int(step) for step in (reported, logged) if step is not None and is_number(step)]  # not NaN
    return max(steps) if steps else None


def reached_end(spool: Spool, job: Job, counted: bool = False) -> Optional[str]:
    """`step 10/10` when the attempt's progress file or log says its work was done, else None: how
    recovery tells a job that completed as its supervisor died from one cut short. `counted`: only
    a count at its total will do, not a final summary (a training stopped early prints one too)."""
    if not job.started_at:
        return None
    report = progress.progress_report(spool, job)
    tail, mtime = progress.log_tail(spool, job, progress.TAIL_BYTES)
    for reading in (
        progress.from_report(*report) if report else None,
        progress.from_log_text(tail.decode("utf-8", "replace"), mtime, progress.num_epochs(job.cmd)) if tail else None,
    ):
        if reading is not None and reading.fraction == 1.0:
            if counted and not (reading.total and reading.step >= reading.total):
                continue
            return _end_text(reading)
    return None


def _end_text(reading: progress.Reading) -> str:
    if not reading.total:
        return "its final summary"
    if reading.kind == "N%":
        return f"{reading.step:g}%"
    word = "epoch" if reading.kind.startswith(progress.EPOCH_KINDS) else "step"
    return f"{word} {reading.step:g}/{reading.total:g}"


def record_preemption(
    spool: Spool, job: Job, exit_code: Optional[int], action: str, by: Optional[str] = None
) -> dict[str, Any]:
    """The changes for a job entering preempted/; `by`: who or what, if not the user or an urgent job."""
    ckpt = checkpoints.latest_checkpoint(job)
    return transitions.preemption(
        job,
        action=action,
        exit_code=exit_code,
        checkpoint=ckpt.path if ckpt else None,
        checkpoint_step=ckpt.step if ckpt else None,
        last_step=last_step(spool, job),
        by=by,
    )
