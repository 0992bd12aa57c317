"""The text of a job's row in `gpuq status`: its time and info cells, and the whole row of a
finished job.

Kept in core, below the spool, because a finished job's row is made in two places that must agree
to the byte: by `gpuq status -a` from the job's file (engine/views/finished_rows.py), and by whoever moves
the job into a finished state, who appends it to cache/finished-journal (spool/journal.py) so that
the first `status -a` over 100,000 finished jobs need not read their files (issue 15).
"""

from __future__ import annotations

import time

from gpuq.core import schema
from gpuq.core.states import FAILED, PENDING, RUNNING, SLURM, TABLE
from gpuq.core.times import duration, parse_iso

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

# Every field finished_cells reads (with info() for a finished state): `gpuq status -a` reads only
# these from a finished job's file (core/shown.py); tests/test_status_cache.py holds it to that.
FINISHED_FIELDS = (
    "name",
    "cmd",
    "started_at",
    "finished_at",
    "exit_code",
    "signal",
    "slurm",
    "reason",
    "code_changed",
    "note",
    "priority",
)
NOTE_SHOWN = tuple(state.name for state in TABLE if state.shows_note)  # the states whose Info ends with the note


def finished_cells(job: dict[str, Any], state: str) -> tuple[str, ...]:
    """Name, script, time and info of a finished job's row: they never change (unless the job
    started and has no end: see depends_on_clock), so `gpuq status -a` caches them."""
    return (job["name"], schema.display_script(job["cmd"]), duration(elapsed(job, time.time())), info(job, state))


def depends_on_clock(job: dict[str, Any]) -> bool:
    """Whether the row's time is counted up to now (a start without an end): such a row is not
    journalled, its file is read each time the cache is filled."""
    return parse_iso(job.get("started_at")) is not None and not parse_iso(job.get("finished_at"))


def elapsed(job: dict[str, Any], now: float) -> Optional[float]:
    start = parse_iso(job.get("started_at"))
    if start is None:
        return None
    end = parse_iso(job.get("finished_at")) or now
    return end - start


def info(job: dict[str, Any], state: str, wait: Any = None) -> str:
    parts = []
    if state == RUNNING:
        parts.append(f"pid={job.get('pid')}" if job.get("pid") else "starting")
        if job.get("gpus") == []:
            parts.append("cpu job")
        elif job.get("slot") is not None:
            parts.append(f"gpu={job['slot']}")
        if job.get("retries"):
            parts.append(f"attempt {job.get('attempts')}/{job['retries'] + 1}")
        if job.get("resumed_from"):
            lost = f", lost {job['lost_steps']} steps" if job.get("lost_steps") is not None else ""
            parts.append(f"from {job['resumed_from'].rstrip('/').rsplit('/', 1)[-1]}{lost}")
    elif state == PENDING:
        if wait is not None:
            parts.append(("blocked: " if wait.forever else "") + wait.reason)
        elif job.get("after"):
            parts.append("after " + ", ".join(f"#{d}" for d in job["after"]) + " (met)")
        if job.get("attempts") or job.get("history"):
            parts.append(job.get("note") or "retry")
    elif state == SLURM:
        parts.append(slurm_text(job.get("slurm") or {}))
    elif job.get("exit_code") is not None:
        parts.append(f"exit={job['exit_code']}" + (f" ({job['signal']})" if job.get("signal") else ""))
    if state != SLURM and (job.get("slurm") or {}).get("job_id"):
        parts.append(f"on slurm {job['slurm']['job_id']}")
    if state == FAILED and job.get("reason"):
        parts.append(job["reason"])
    if job.get("code_changed"):
        parts.append(job["code_changed"])
    note = job.get("note")
    if note and job.get("reason") and "time limit" in note and "time limit" in job["reason"]:
        note = None  # said once, by the reason
    if state in NOTE_SHOWN and note:
        parts.append(note)
    if job.get("priority"):
        parts.append(f"prio={job['priority']}")
    return "  ".join(parts)


def slurm_text(mark: dict[str, Any]) -> str:
    """`slurm 123 PENDING (Dependency)`: the Slurm job, its state and why it waits."""
    reason = f" ({mark['reason']})" if mark.get("reason") else ""
    return f"slurm {mark.get('job_id') or '?'} {mark.get('state') or '?'}{reason}"
