"""What ran, from finished job files: one `PastRun` per attempt, and per-group totals for `gpuq history`.

Pure functions over job dicts (`(state, job)` pairs, the state being the job's directory); no
spool access, so the caller decides which jobs to read.

Counting rules:
- A run is one entry of a job's `history` (one attempt) with a known start and end, so a job
  preempted and resumed gives two runs. A job file without `history` entries but with
  `started_at`/`finished_at` (older files) gives one run, its outcome being the job's state.
- GPUs held: the attempt's own `gpus`/`slot` if it recorded them, else the job's (the newest
  attempt's, for a job that ran on several GPUs over its attempts); `gpus` (non-empty list) wins
  over `slot` ("0,1"), which wins over `gpu_request` (default 1). `gpu_request: 0` is a CPU job:
  0 GPUs, whatever else is recorded.
- GPU-hours = run time x GPUs held. Adopted jobs are included but approximate: their start is the
  process's real start, their end is when gpuq noticed the process gone (seconds to minutes late).
- Time window: a run counts when it ended at or after `since`; a preemption when its `at` is.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Optional, Union

from gpuq.core.states import CANCELLED, DONE, FAILED, INTERRUPTED, PENDING, PREEMPTED

GROUP_KEYS = ("dir", "script", "day", "sweep")
# What each attempt outcome counts as. "pending" is an attempt that failed and was retried.
FAILED_OUTCOMES = (FAILED, PENDING)
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".zsh", ".jl", ".r", ".lua", ".pl", ".rb", ".js", ".ts")

JobPair = tuple[str, dict]


@dataclass(frozen=True)
class PastRun:
    """One attempt of one job, from its start to its end (epoch seconds)."""

    job_id: int
    name: str
    cwd: str
    script: str
    attempt: Optional[int]
    start: float
    end: float
    outcome: str
    gpus: tuple[str, ...]  # GPU indices held, as strings; () when unknown or none
    gpu_count: int
    sweep: Optional[Union[int, str]]  # the sweep id, or None
    adopted: bool = False  # start/end known only roughly (see the module docstring)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpu_count / 3600.0

    @property
    def lanes(self) -> tuple[str, ...]:
        """Timeline lanes: one per GPU held; "cpu" for a CPU job; "machine" with no GPU detail."""
        if self.gpus:
            return self.gpus
        return ("cpu",) if self.gpu_count == 0 else ("machine",)


@dataclass
class Group:
    """Totals of one group of runs. `preempted` counts preemption records, not runs."""

    key: Union[int, str, None]  # cwd, script, "YYYY-MM-DD" (local) or sweep id; None: not in a sweep
    runs: int = 0
    jobs: int = 0
    done: int = 0
    failed: int = 0  # failed attempts, including ones that were retried
    cancelled: int = 0
    interrupted: int = 0
    preempted: int = 0
    adopted: int = 0  # runs whose times are approximate
    gpu_hours: float = 0.0
    median_seconds: Optional[float] = None
    first: Optional[float] = None  # earliest start of its runs (epoch seconds)
    last: Optional[float] = None  # latest end of its runs
    _seconds: list[float] = field(default_factory=list, repr=False)
    _job_ids: set[int] = field(default_factory=set, repr=False)


def parse_time(value: Any) -> Optional[float]:
    """ISO 8601 -> epoch seconds; None for null or anything unreadable (a bad field in one job
    file must not stop the history). A time without offset is local time."""
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value.endswith("Z") else value  # fromisoformat of 3.9 lacks "Z"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


SINCE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`--since` value -> epoch seconds: a duration back from `now` (`90m`, `12h`, `7d`, `2w`) or
    a date/time (`2024-05-01`, `2024-05-01T09:00`, local time unless an offset is given).
    ValueError with a one-line message otherwise."""
    match = SINCE_RE.match(text)
    if match:
        return now - float(match.group(1)) * SINCE_UNITS[match.group(2)]
    stamp = parse_time(text.strip())
    if stamp is None:
        raise ValueError(f"--since {text!r}: give a duration like 12h, 7d, 2w or a date like 2024-05-01")
    return stamp


def script_of(cmd: Any) -> str:
    """What `--by script` groups on: the first argv word that names a script file (its base name,
    e.g. `train.py` in `torchrun --nproc 2 src/train.py --lr 1`), else the module of `python -m
    MOD`, else the base name of the program."""
    if isinstance(cmd, str):
        cmd = cmd.split()
    if not isinstance(cmd, list) or not cmd or not all(isinstance(word, str) for word in cmd):
        return "?"
    for word in cmd:
        if not word.startswith("-") and word.lower().endswith(SCRIPT_SUFFIXES):
            return os.path.basename(word)
    for before, word in zip(cmd, cmd[1:]):
        if before == "-m":
            return word
    return os.path.basename(cmd[0]) or cmd[0]


def _gpus_of(record: dict) -> Optional[tuple[str, ...]]:
    gpus = record.get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in gpus):
        return tuple(str(g) for g in gpus)
    slot = record.get("slot")
    if isinstance(slot, str) and slot.strip():
        return tuple(part.strip() for part in slot.split(",") if part.strip())
    return None


def gpus_held(job: dict, attempt: Optional[dict] = None) -> tuple[tuple[str, ...], int]:
    """(GPU indices, GPU count) for an attempt of `job` (rules in the module docstring)."""
    request = job.gpu_request
    if not isinstance(request, int) or isinstance(request, bool) or request < 0:
        request = 1
    if request == 0:
        return (), 0
    gpus = (_gpus_of(attempt) if attempt else None) or _gpus_of(job)
    if gpus:
        return gpus, len(gpus)
    return (), request


def _sweep_id(job: dict) -> Optional[Union[int, str]]:
    sweep = job.sweep
    if isinstance(sweep, dict) and isinstance(sweep.get("id"), (int, str)) and not isinstance(sweep.get("id"), bool):
        return sweep["id"]
    return None


def _attempts(state: str, job: dict) -> list[dict]:
    history = job.history
    entries = [entry for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []
    if entries:
        return entries
    # Files from before `history` existed: the job's own fields describe its one attempt.
    return [
        {
            "attempt": job.attempts,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "outcome": state,
        }
    ]


def job_runs(state: str, job: dict) -> list[PastRun]:
    """The runs of one job, in attempt order."""
    if not isinstance(job, dict):
        return []
    job_id = job.id if isinstance(job.id, int) else -1
    name = job.name if isinstance(job.name, str) else str(job_id)
    cwd = job.cwd if isinstance(job.cwd, str) else "?"
    script, sweep, adopted = script_of(job.cmd), _sweep_id(job), bool(job.adopted)
    result = []
    for entry in _attempts(state, job):
        start, end = parse_time(entry.get("started_at")), parse_time(entry.get("finished_at"))
        if start is None or end is None:
            continue
        gpus, count = gpus_held(job, entry)
        attempt = entry.get("attempt") if isinstance(entry.get("attempt"), int) else None
        outcome = entry.get("outcome") if isinstance(entry.get("outcome"), str) else state
        result.append(PastRun(job_id, name, cwd, script, attempt, start, end, outcome, gpus, count, sweep, adopted))
    return result


def runs(jobs: Iterable[JobPair]) -> list[PastRun]:
    """Every run of every job, ordered by start time (then job id, attempt)."""
    result = [run for state, job in jobs for run in job_runs(state, job)]
    result.sort(key=lambda r: (r.start, r.job_id, r.attempt if r.attempt is not None else -1))
    return result


def preemption_times(job: dict) -> list[float]:
    """When the job was preempted (epoch seconds), from its `preemptions` records."""
    records = job.preemptions if isinstance(job, dict) else None
    if not isinstance(records, list):
        return []
    times = (parse_time(record.get("at")) for record in records if isinstance(record, dict))
    return [at for at in times if at is not None]


def day_of(stamp: float) -> str:
    """The local calendar day of an epoch time, YYYY-MM-DD."""
    return datetime.fromtimestamp(stamp).strftime("%Y-%m-%d")


def _key(by: str, run_or_job: Union[PastRun, dict], stamp: float) -> Union[int, str, None]:
    if by == "day":
        return day_of(stamp)
    if isinstance(run_or_job, PastRun):
        return {"dir": run_or_job.cwd, "script": run_or_job.script, "sweep": run_or_job.sweep}[by]
    job = run_or_job
    if by == "dir":
        return job.cwd if isinstance(job.cwd, str) else "?"
    if by == "script":
        return script_of(job.cmd)
    return _sweep_id(job)


def _order(key: Union[int, str, None]) -> tuple:
    # None (jobs outside any sweep) last; ints before strings so sweep ids sort numerically.
    if key is None:
        return (2, 0, "")
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def summarize(jobs: Iterable[JobPair], since: Optional[float] = None, by: str = "dir") -> list[Group]:
    """Per-group totals of the runs that ended at or after `since` (epoch seconds; None: all),
    grouped `by` "dir" (cwd), "script" (`script_of`), "day" (local day the run ended) or "sweep"
    (sweep id; None groups the jobs outside sweeps). Groups are sorted by key: days
    chronologically, directories and scripts alphabetically, sweep ids numerically, None last.
    `median_seconds` is over all runs of the group, whatever their outcome.
    ValueError for an unknown `by`."""
    if by not in GROUP_KEYS:
        raise ValueError(f"--by {by!r}: choose one of {', '.join(GROUP_KEYS)}")
    groups: dict[Union[int, str, None], Group] = {}
    for state, job in jobs:
        for run in job_runs(state, job):
            if since is None or run.end >= since:
                _add_run(groups.setdefault(_key(by, run, run.end), Group(_key(by, run, run.end))), run)
        for at in preemption_times(job):
            if since is None or at >= since:
                key = _key(by, job, at)
                groups.setdefault(key, Group(key)).preempted += 1
    for group in groups.values():
        group.median_seconds = statistics.median(group._seconds) if group._seconds else None
        group.jobs = len(group._job_ids)
    return [groups[key] for key in sorted(groups, key=_order)]


def _add_run(group: Group, run: PastRun) -> None:
    group.runs += 1
    group._job_ids.add(run.job_id)
    if run.outcome == DONE:
        group.done += 1
    elif run.outcome in FAILED_OUTCOMES:
        group.failed += 1
    elif run.outcome == CANCELLED:
        group.cancelled += 1
    elif run.outcome == INTERRUPTED:
        group.interrupted += 1
    group.adopted += run.adopted
    group.gpu_hours += run.gpu_hours
    group._seconds.append(run.seconds)
    group.first = run.start if group.first is None else min(group.first, run.start)
    group.last = run.end if group.last is None else max(group.last, run.end)


def iso(stamp: Optional[float]) -> Optional[str]:
    """Epoch seconds -> ISO 8601 in local time with its offset, as job files write times."""
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).astimezone().isoformat(timespec="seconds")


def to_json(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """`history --json`: one object per group, plain JSON types, times ISO 8601, GPU-hours
    rounded to 0.001 h and seconds to 0.1 s."""
    return [
        {
            "key": group.key,
            "runs": group.runs,
            "jobs": group.jobs,
            DONE: group.done,
            FAILED: group.failed,
            CANCELLED: group.cancelled,
            INTERRUPTED: group.interrupted,
            PREEMPTED: group.preempted,
            "adopted": group.adopted,
            "gpu_hours": round(group.gpu_hours, 3),
            "median_seconds": None if group.median_seconds is None else round(group.median_seconds, 1),
            "first": iso(group.first),
            "last": iso(group.last),
        }
        for group in groups
    ]
