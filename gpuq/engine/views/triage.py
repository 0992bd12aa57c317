"""`gpuq triage ID`: one job's state, why it waits or failed, its log's end (TAIL_BYTES read, whatever
its size), its checkpoint and the command lines that would fix it, as one JSON-ready dict."""

from __future__ import annotations

from contextlib import suppress
from typing import Any, Optional

from gpuq.core import failure
from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, FAILED, FINISHED, HELD, INTERRUPTED, PENDING, PREEMPTED, RUNNING
from gpuq.core.times import iso_of, parse_iso
from gpuq.engine.lifecycle import actions
from gpuq.engine.tracking import checkpoints
from gpuq.engine.views import fixes
from gpuq.engine.views.card import log_gone, why_waiting
from gpuq.engine.views.fixes import DISK_FULL, GPU_OOM, HOST_OOM, KILLED_BY_USER, OOM_KILLER, OTHER, TIME_LIMIT
from gpuq.spool import Spool

LOG_LINES = 30  # the log lines a triage shows unless asked for another number
MAX_LOG_LINES = 500  # the most it shows, whatever is asked
TAIL_BYTES = failure.TAIL_BYTES  # read from the log's end, never more: a 1 GiB log costs the same
MAX_LINE_CHARS = 400  # a line longer than this (a log without line breaks) is cut

# The causes a triage tells apart, from core/failure.py's wording (tests/test_triage.py holds the two).
_CAUSE_PREFIXES = (
    ("time limit of ", TIME_LIMIT),
    ("CUDA out of memory", GPU_OOM),
    ("GPU out of memory", GPU_OOM),
    ("out of CPU memory", HOST_OOM),
    ("host memory limit of ", HOST_OOM),
    ("killed by SIGKILL", OOM_KILLER),
    ("a child process was killed by SIGKILL", OOM_KILLER),
    ("disk full", DISK_FULL),
    ("stopped by `gpuq kill`", KILLED_BY_USER),
)
_TRIED = "tried to allocate "


def triage(spool: Spool, job_id: int, lines: int = LOG_LINES) -> dict[str, Any]:
    """What is known about job `job_id` and what would fix it; refused for an id naming no job."""
    ref, job = actions.get(spool, job_id)
    state = ref.state
    out: dict[str, Any] = {"id": job.id, "name": job.name, "state": state, "note": job.note}
    if state in (PENDING, HELD):
        out["waiting_for"] = job.note if state == HELD and job.note else why_waiting(spool, state, job)
    if state == RUNNING:
        out["pid"] = job.pid
    tail = spool.logs.tail(job, TAIL_BYTES)[0] if job.started_at or state == RUNNING else b""
    out.update(_ending(job, state, tail))
    out["log"] = spool.logs.path_of(job)
    out["log_gone"] = log_gone(spool, ref, job)  # `was removed (...)`; None while it is there
    out["log_tail"] = log_lines(tail, lines)
    out["checkpoint"] = checkpoint_facts(job)
    out["fixes"] = fixes.suggest(spool, job, state, out)
    return out


def _ending(job: Job, state: str, tail: bytes) -> dict[str, Any]:
    """How its latest attempt ended (also a pending job's that failed): exit, reason, cause, run time."""
    ended = state in (*FINISHED, PREEMPTED, INTERRUPTED) or job.exit_code is not None
    started, finished = parse_iso(job.started_at), parse_iso(job.finished_at)
    run = finished - started if started is not None and finished is not None and finished >= started else None
    if not ended:
        return {"run_seconds": None}
    reason = job.reason
    if reason is None and state in (FAILED, CANCELLED, INTERRUPTED) and tail:
        reason = failure.reason(tail, job.exit_code, job.signal)  # ended without one recorded
    out = {
        "exit_code": job.exit_code,
        "signal": job.signal,
        "reason": reason,
        "cause": cause_of(reason, job.note) if (reason or job.note) else None,
        "run_seconds": None if run is None else round(run, 1),
    }
    tried = reason.split(_TRIED, 1)[1].split(")", 1)[0].strip() if reason and _TRIED in reason else ""
    if tried:  # `2.00 GiB` of `CUDA out of memory (tried to allocate 2.00 GiB)`
        out["tried_to_allocate"] = tried
    return out


def cause_of(reason: Optional[str], note: Optional[str] = None) -> str:
    """The kind of failure a reason names; a preempted job's note says when its time limit did."""
    found = [cause for prefix, cause in _CAUSE_PREFIXES if reason and reason.startswith(prefix)]
    if found:
        return found[0]
    if note and "time limit of" in note:
        return TIME_LIMIT
    return OTHER


def log_lines(tail: bytes, count: int = LOG_LINES) -> list[str]:
    """The last `count` lines (at most MAX_LOG_LINES) the latest attempt wrote, as a terminal shows
    them, without gpuq's own, each cut at MAX_LINE_CHARS."""
    count = max(0, min(count, MAX_LOG_LINES))
    found = failure.latest_attempt_lines(tail) if tail else []
    while found and not found[-1].strip():
        found.pop()
    shown = found[-count:] if count else []
    return [line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..." for line in shown]


def checkpoint_facts(job: Job) -> dict[str, Any]:
    """The newest complete checkpoint, where gpuq looked, the one recorded, whether one is resumed."""
    latest = None
    with suppress(OSError):
        latest = checkpoints.latest_checkpoint(job)
    return {
        "latest": latest.path if latest else None,
        "step": latest.step if latest else None,
        "written_at": iso_of(checkpoints.written_at(latest.path)) if latest else None,
        "where_looked": checkpoints.where_looked(job),
        "recorded": job.checkpoint,
        "resumed_from": job.resumed_from,
        "resumes": not job.no_resume,
    }
