"""What a preemption leaves behind: the newest complete checkpoint, the last step reached, and
how many steps were lost in between (spool_layout.md, section 11)."""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core import transitions
from gpuq.engine import attempt, checkpoints, progress
from gpuq.spool import Spool


def last_step(spool: Spool, job: dict[str, Any]) -> Optional[int]:
    """The furthest step the current attempt reported: its progress file or its log."""
    steps = []
    report = attempt.progress_report(spool, job)
    reported = report[0].get("step") if report else None
    if isinstance(reported, (int, float)) and not isinstance(reported, bool):
        steps.append(int(reported))
    tail, _mtime = attempt.log_tail(spool, job, progress.TAIL_BYTES)
    logged = progress.last_step(tail)
    if logged is not None:
        steps.append(logged)
    return max(steps) if steps else None


def record(
    spool: Spool, job: dict[str, Any], exit_code: Optional[int], action: str, by: Optional[str] = None
) -> dict[str, Any]:
    """The changes for a job entering preempted/ (see transitions.preemption); `by`: who or what
    preempted it, when not the user or an urgent job (its time limit)."""
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
