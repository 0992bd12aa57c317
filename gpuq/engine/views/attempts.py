"""Each attempt of one job as a line: how it ended, what it had (its GPU share, its host memory)
and why the next one had more (core/oom.py), for `gpuq show` and `gpuq history ID`. Read from the
job's own history entries: an attempt recorded before they held its share says nothing of it."""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core.job import Job
from gpuq.core.states import PENDING
from gpuq.core.times import duration, parse_iso
from gpuq.core.words import size_text


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
    if entry.get("reason"):
        parts.append(str(entry["reason"]))
    if entry.get("change"):
        parts.append(str(entry["change"]))
    return "; ".join(parts)


def attempt_lines(job: Job) -> list[tuple[str, str]]:
    """(`attempt 2`, what it was) for every recorded attempt, oldest first."""
    return [(f"attempt {entry.get('attempt', '?')}", attempt_line(entry)) for entry in job.history]


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
