"""What `gpuq history` and the queue's ETA read of a job (its command key, run time and runs), as
the finished index's rows and `kept-runs` hold them: here, below the engine, because the index is
made in the spool. Tolerant: a bad value in one job file gives an unknown, never an error.
"""

from __future__ import annotations

import json
import marshal
from typing import Any, Callable, Optional

from gpuq.core.job import Job
from gpuq.core.times import parse_iso


def command_key(cmd: Any, cwd: Any) -> str:
    """What makes two runs the same for the ETA: the command and its directory, as a JSON text
    (history reads them back from it: few distinct keys, each decoded once)."""
    return json.dumps([list(cmd) if isinstance(cmd, (list, tuple)) else cmd, cwd])


def parse_time(value: Any) -> Optional[float]:
    """ISO 8601 -> epoch seconds (no offset: local time); None for null or anything unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value.endswith("Z") else value  # fromisoformat of 3.9 lacks "Z"
    try:
        return parse_iso(text)
    except ValueError:
        return None


def run_seconds(job: Job) -> Optional[float]:
    """The job's run time for the ETA: finished minus started; None when either is unknown, the
    end comes first, or the job was adopted (its times are only approximate)."""
    if job.adopted:
        return None
    start, end = parse_time(job.started_at), parse_time(job.finished_at)
    return end - start if start is not None and end is not None and end >= start else None


def _gpus_of(gpus: Any, slot: Any) -> Optional[list[str]]:
    if isinstance(gpus, list) and gpus and all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in gpus):
        return [str(g) for g in gpus]
    if isinstance(slot, str) and slot.strip():
        return [part.strip() for part in slot.split(",") if part.strip()]
    return None


def gpus_held(job: Job, attempt: Optional[dict[str, Any]] = None) -> tuple[list[str], float]:
    """(GPU indices, GPU count) of an attempt of `job`: the attempt's own `gpus`/`slot` if it
    recorded them, else the job's; `gpus` (non-empty) wins over `slot` ("0,1"), which wins over
    `gpu_request` (default 1). `gpu_request: 0` is a CPU job: 0 GPUs, whatever else is recorded. An
    attempt that held --gpu-mem shares counts the GPUs' worth they were (its `gpu_share`)."""
    request = job.gpu_request
    if not isinstance(request, int) or isinstance(request, bool) or request < 0:
        request = 1
    if request == 0:
        return [], 0
    gpus = (_gpus_of(attempt.get("gpus"), attempt.get("slot")) if attempt else None) or _gpus_of(job.gpus, job.slot)
    share = attempt.get("gpu_share") if attempt else None
    if isinstance(share, (int, float)) and not isinstance(share, bool) and 0 <= share:
        return gpus or [], share
    if gpus:
        return gpus, len(gpus)
    return [], request


def attempts(state: str, job: Job) -> list[list[Any]]:
    """[attempt, start, end, outcome, GPUs, GPU count, reason] of each attempt with a known start
    and end, in attempt order. The attempt is its place in the job's history (1, 2, ...), as `gpuq
    history ID` numbers it: the job's own count starts again at a resume or a retry by hand. The
    outcome is `state` where the attempt does not say; the reason, why it failed (None: not
    recorded). A file from before `history` existed: the job's own fields describe its one attempt."""
    history = job.history
    entries = [entry for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []
    if not entries:
        entries = [{"started_at": job.started_at, "finished_at": job.finished_at, "reason": job.reason}]
    out = []
    for number, entry in enumerate(entries, 1):
        start, end = parse_time(entry.get("started_at")), parse_time(entry.get("finished_at"))
        if start is None or end is None:
            continue
        outcome, reason = entry.get("outcome"), entry.get("reason")
        outcome = outcome if isinstance(outcome, str) else state
        why = reason if isinstance(reason, str) and reason else None
        out.append([number, start, end, outcome, *gpus_held(job, entry), why])
    return out


def facts(state: str, job: Job) -> list[Any]:
    """[sweep id, adopted, attempts, preemption times]: what history reads besides the key."""
    sweep = job.sweep.get("id") if isinstance(job.sweep, dict) else None
    records = job.preemptions if isinstance(job.preemptions, list) else []
    times = [parse_time(record.get("at")) for record in records if isinstance(record, dict)]
    return [
        sweep if isinstance(sweep, (int, str)) and not isinstance(sweep, bool) else None,
        bool(job.adopted),
        attempts(state, job),
        [at for at in times if at is not None],
    ]


def past_text(state: str, job: Job) -> str:
    return json.dumps(facts(state, job))


def read_pasts(pasts: list[Any]) -> list[list[Any]]:
    """The facts of many rows' pasts: the index holds them as marshal bytes, kept-runs as JSON text
    (a damaged one reads as no runs)."""
    damaged: list[Any] = [None, False, [], []]
    return [
        _read_one(past, damaged, _is_past, json.loads if isinstance(past, str) else marshal.loads) for past in pasts
    ]


def read_keys(keys: list[str]) -> dict[str, tuple[Any, Any]]:
    """key -> (cmd, cwd) of each distinct command key (a damaged one: ("?", "?"))."""
    return {key: tuple(_read_one(key, ["?", "?"], _is_key)) for key in dict.fromkeys(keys)}


def _read_one(data: Any, damaged: list[Any], valid: Callable[[Any], bool], load: Callable = json.loads) -> Any:
    try:
        value = load(data)
    except (EOFError, ValueError, TypeError, RecursionError):
        return damaged
    return value if valid(value) else damaged


def _is_key(value: Any) -> bool:
    return type(value) is list and len(value) == 2


def _is_past(value: Any) -> bool:
    return type(value) is list and len(value) == 4 and type(value[2]) is list and type(value[3]) is list
