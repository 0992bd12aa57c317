"""Each attempt of one job as a line: how it ended, what it had (its GPU share, its host memory),
where it resumed from and why the next one had more (core/oom.py), for `gpuq show` and `gpuq
history ID`. Read from the job's own history entries: an attempt recorded before they held its
share says nothing of it.

Attempts are numbered by their place in the history (1, 2, ...), not by the entry's `attempt`: that
is the job's count of attempts, which a resume after a preemption or a retry by hand starts again
(`--retries` counts from there), so two runs of a resumed job would both be "attempt 1"."""

from __future__ import annotations

import os
from typing import Any, Optional

from gpuq.core.job import Job
from gpuq.core.states import PENDING
from gpuq.core.times import duration, parse_iso
from gpuq.core.words import plural, size_text


def had(entry: dict[str, Any]) -> str:
    """`20G of a GPU`, `a whole GPU`, `, 32G host memory`: what the attempt ran with."""
    parts = []
    if "gpu_mem_mib" in entry and _had_gpus(entry):
        mib = entry["gpu_mem_mib"]
        parts.append(f"{size_text(mib)} of a GPU" if isinstance(mib, int) else "a whole GPU")
    if isinstance(entry.get("mem_mib"), int):
        parts.append(f"{size_text(entry['mem_mib'])} host memory")
    return ", ".join(parts)


def _had_gpus(entry: dict[str, Any]) -> bool:
    """A local attempt held the GPUs its entry lists (none for a CPU job, `null` where gpuq saw no
    GPU at all, as on a machine without one); an attempt on Ray (no `gpus`) the share recorded."""
    return "gpus" not in entry or bool(entry["gpus"])


def attempt_line(entry: dict[str, Any]) -> str:
    ended = entry.get("outcome") or "?"
    if ended == PENDING:  # back to the queue: a retry after a failure
        ended = "failed, retried" if entry.get("exit_code") not in (None, 0) else "retried"
    code = entry.get("exit_code")
    ran = _ran(entry.get("started_at"), entry.get("finished_at"))
    parts = [f"{ended}" + (f" (exit {code})" if code not in (None, 0) else "") + (f" after {ran}" if ran else "")]
    gpus = entry.get("gpus")
    held = had(entry)
    if held or gpus:
        parts.append("had " + (held or "") + (f" on GPU {','.join(map(str, gpus))}" if gpus else ""))
    resumed = resumed_text(entry)
    if resumed:
        parts.append(resumed)
    if entry.get("reason"):
        parts.append(str(entry["reason"]))
    if entry.get("change"):
        parts.append(str(entry["change"]))
    return "; ".join(parts)


def resumed_text(entry: dict[str, Any]) -> str:
    """`from checkpoint-20, lost 3 steps`: where an attempt that went on from an earlier one
    started, and what the interruption cost; '' for a first attempt."""
    checkpoint, lost = entry.get("resumed_from"), entry.get("lost_steps")
    lost_text = f", lost {plural(lost, 'step')}" if isinstance(lost, int) else ""
    if isinstance(checkpoint, str) and checkpoint:
        return f"from {os.path.basename(checkpoint.rstrip('/'))}{lost_text}"
    return f"from the start{lost_text}" if lost_text else ""


def attempt_lines(job: Job) -> list[tuple[str, str]]:
    """(`attempt 2`, what it was) for every recorded attempt, oldest first, numbered in that order."""
    return [(f"attempt {number}", attempt_line(entry)) for number, entry in enumerate(job.history, 1)]


def attempts_json(job: Job) -> list[dict[str, Any]]:
    """`history --json ID`: each attempt's history entry, numbered as `attempt_lines` numbers them
    (the entry's own count, which a resume starts again, as `job_attempt`)."""
    return [
        {**entry, "attempt": number, "job_attempt": entry.get("attempt")} for number, entry in enumerate(job.history, 1)
    ]


def oom_retries_text(job: Job, ended: bool = False) -> str:
    """`1 of 2 (--retry-oom 2); GPUQ_OOM_RETRY=1`; '' for a job that has had none and may have none.
    `ended`: the job is finished, and has no next attempt to speak of."""
    if not (job.retry_oom or job.oom_retries):
        return ""
    allowed = f" of {job.retry_oom} (--retry-oom {job.retry_oom})" if job.retry_oom else ""
    return f"{job.oom_retries}{allowed}" + (
        f"; its next attempt has GPUQ_OOM_RETRY={job.oom_retries}" if job.oom_retries and not ended else ""
    )


def _ran(start: Optional[str], end: Optional[str]) -> str:
    began, ended = parse_iso(start), parse_iso(end)
    if began is None or ended is None:
        return ""
    return duration(max(0.0, ended - began)) or ""
