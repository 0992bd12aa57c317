"""How a job that goes back to the queue continues: from the newest complete checkpoint it wrote
itself, so that a ten-hour training interrupted at 90% does not start again from step 0.

Used wherever a job that has already run is queued again: `gpuq retry`, `gpuq recover` (and
`gpuq run --recover`), an automatic retry after a failure, `gpuq resume`. The checkpoint rules are
engine/checkpoints.py's: complete ones only, and only those written since the job's run began
(`ckpt_since`), never a stale one of an earlier run in the same output directory.
"""

from __future__ import annotations

from typing import Any

from gpuq.core.transitions import Continuation
from gpuq.engine import checkpoints, preemption
from gpuq.spool import Spool


def plan(spool: Spool, job: dict[str, Any], from_scratch: bool = False) -> Continuation:
    """How `job` goes on after the attempt it has just ended (or that was interrupted)."""
    last = preemption.last_step(spool, job) if job.started_at else None
    if from_scratch or job.no_resume:
        return Continuation(None, None, last, from_scratch=True)
    found = checkpoints.latest_checkpoint(job)
    if found is None:
        return Continuation(None, None, last)
    return Continuation(found.path, found.step, last)
