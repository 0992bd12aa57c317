"""Each attempt of one job as a line (how it ended, its GPU share and host memory, where it resumed,
why the next had more), for `gpuq show` and `gpuq history ID`, from its history entries. Numbered by
their place in the history: the entry's `attempt` starts again at a resume or a retry by hand."""

from __future__ import annotations

import os
from typing import Any

from gpuq.core.job import Job
from gpuq.core.states import FINISHED, PENDING, RUNNING, STATES, why_ended
from gpuq.core.times import duration, parse_iso
from gpuq.core.words import plural, size_text


def had(entry: dict[str, Any]) -> str:
    """`20G of a GPU (GPU 0)`, `a whole GPU (GPU 1) and 32G host memory`: what the attempt ran with,
    the GPUs it held said of the GPU, not of the host memory; '' for nothing known."""
    gpus = entry.get("gpus")
    where = f"GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}" if gpus else ""
    parts = [where] if where else []
    # a local attempt held the GPUs its entry lists (none, or `null` without GPUs); one on Ray (no
    # `gpus`) the share recorded
    if "gpu_mem_mib" in entry and ("gpus" not in entry or gpus):
        mib = entry["gpu_mem_mib"]
        whole = f"{len(gpus)} whole GPUs" if gpus and len(gpus) > 1 else "a whole GPU"
        share = f"{size_text(mib)} of a GPU" if isinstance(mib, int) else whole
        parts = [f"{share} ({where})" if where else share]
    if isinstance(entry.get("mem_mib"), int):
        parts.append(f"{size_text(entry['mem_mib'])} host memory")
    return " and ".join(parts)


def attempt_line(entry: dict[str, Any]) -> str:
    ended = entry.get("outcome") or "?"
    if ended == PENDING:  # back to the queue: a retry after a failure
        ended = "failed, retried" if entry.get("exit_code") not in (None, 0) else "retried"
    code = entry.get("exit_code")
    began, finished = parse_iso(entry.get("started_at")), parse_iso(entry.get("finished_at"))
    ran = duration(max(0.0, finished - began)) if began is not None and finished is not None else ""
    parts = [f"{ended}" + (f" (exit {code})" if code not in (None, 0) else "") + (f" after {ran}" if ran else "")]
    held = had(entry)
    if held:
        parts.append("had " + held)
    why = (
        why_ended(entry["outcome"], entry.get("reason"), entry.get("note")) if entry.get("outcome") in STATES else None
    )
    parts += [resumed_text(entry), why or str(entry.get("reason") or ""), str(entry.get("change") or "")]
    return "; ".join(part for part in parts if part)


def resumed_text(entry: dict[str, Any]) -> str:
    """`from checkpoint-20, lost 3 steps`: where a continued attempt started; '' for a first one."""
    checkpoint, lost = entry.get("resumed_from"), entry.get("lost_steps")
    lost_text = f", lost {plural(lost, 'step')}" if isinstance(lost, int) else ""
    if isinstance(checkpoint, str) and checkpoint:
        return f"from {os.path.basename(checkpoint.rstrip('/'))}{lost_text}"
    return f"from the start{lost_text}" if lost_text else ""


def attempt_lines(job: Job) -> list[tuple[str, str]]:
    """(`attempt 2`, what it was) for every recorded attempt, oldest first, numbered in that order."""
    return [(f"attempt {number}", attempt_line(entry)) for number, entry in enumerate(job.history, 1)]


def attempts_json(job: Job) -> list[dict[str, Any]]:
    """`history --json ID`: each history entry, numbered as `attempt_lines` does (its own as `job_attempt`)."""
    return [
        {**entry, "attempt": number, "job_attempt": entry.get("attempt")} for number, entry in enumerate(job.history, 1)
    ]


def oom_retries_text(job: Job, state: str) -> str:
    """`1 of 2 (--retry-oom 2); its next attempt has GPUQ_OOM_RETRY=1`; '' when it had and may have
    none. A person's `gpuq retry` (or resume) gives a fresh --retry-oom: those since are counted
    against it, and all of them (GPUQ_OOM_RETRY's count) said beside."""
    if not (job.retry_oom or job.oom_retries):
        return ""
    ended = job.attempts - (state == RUNNING)  # this round's attempts with a history entry
    used = sum(1 for entry in job.history[max(0, len(job.history) - ended) :] if entry.get("change")) if ended else 0
    allowed = f"{used} of {job.retry_oom} (--retry-oom {job.retry_oom})" if job.retry_oom else str(job.oom_retries)
    if job.retry_oom and used != job.oom_retries:
        allowed += f" since it was last queued again by hand, {job.oom_retries} in all"
    which = "this attempt has" if state == RUNNING else "its next attempt has"  # a running one has its own
    told = job.oom_retries and state not in FINISHED
    return allowed + (f"; {which} GPUQ_OOM_RETRY={job.oom_retries}" if told else "")
