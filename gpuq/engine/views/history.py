"""What ran: one `PastRun` per attempt, and per-group totals for `gpuq history`, over `JobRecord`s
(a finished job's from its index row: no job file opened) or `(state, job)` pairs. A run is an
attempt with a known start and end; GPU-hours are its time x its GPUs, a --gpu-mem share as its part
of its GPU (its MiB over the GPU's memory). An adopted job's end is when
gpuq noticed it gone. A run counts in a time window when it ended in it, a preemption at its `at`.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from typing import Any, Iterable, NamedTuple, Optional, Union

from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, DONE, FAILED, INTERRUPTED, PENDING, PREEMPTED
from gpuq.core.times import median
from gpuq.spool.cache.runs import facts, parse_time, read_keys, read_pasts

GROUP_KEYS = ("dir", "script", "day", "sweep")
# The Group field counting each attempt outcome; a "pending" attempt failed and was retried.
COUNTERS = {PENDING: FAILED, **{state: state for state in (DONE, FAILED, CANCELLED, INTERRUPTED)}}
COUNTS = ("runs", "jobs", DONE, FAILED, CANCELLED, INTERRUPTED, PREEMPTED, "adopted")  # Group fields, as JSON
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".zsh", ".jl", ".r", ".lua", ".pl", ".rb", ".js", ".ts")

JobPair = tuple[str, Job]


class PastRun(NamedTuple):
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
    gpu_count: float  # GPUs held, a --gpu-mem share counted as its part of its GPU
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


class JobRecord(NamedTuple):
    """What history reads of one job: who it is, its runs and preemptions (spool/cache/runs.py:
    `attempts` are [attempt, start, end, outcome, GPUs, GPU count, reason], the reason not always)."""

    job_id: int
    name: str
    cwd: str
    script: str
    sweep: Any
    adopted: bool
    attempts: list
    preempted: list


class Group:
    """Totals of one group of runs (`preempted` counts preemption records). A plain class:
    `dataclasses` (with `inspect`) would be most of `gpuq history`'s imports."""

    def __init__(self, key: Union[int, str, None]) -> None:
        self.key = key  # cwd, script, "YYYY-MM-DD" (local) or sweep id; None: not in a sweep
        self.runs = 0
        self.jobs = 0
        self.done = 0
        self.failed = 0  # failed attempts, including ones that were retried
        self.cancelled = 0
        self.interrupted = 0
        self.preempted = 0
        self.adopted = 0  # runs whose times are approximate
        self.gpu_hours = 0.0
        self.median_seconds: Optional[float] = None
        self.first: Optional[float] = None  # earliest start of its runs (epoch seconds)
        self.last: Optional[float] = None  # latest end of its runs
        self.gpu_use: Optional[dict[str, Any]] = None  # what its jobs' GPUs did (gpuuse.summary), added by the caller
        self.failures: list[dict[str, Any]] = []  # each failed run: job id, attempt, reason (None: not recorded)
        self._seconds: list[float] = []
        self._job_ids: set[int] = set()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Group) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Group({vars(self)})"


SINCE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`--since` -> epoch seconds: a duration back from `now` (`12h`, `2w`) or a date/time (local
    unless an offset is given); ValueError with a one-line message otherwise."""
    match = SINCE_RE.match(text)
    if match:
        return now - float(match.group(1)) * SINCE_UNITS[match.group(2)]
    stamp = parse_time(text.strip())
    if stamp is None:
        raise ValueError(f"--since {text!r}: give a duration like 12h, 7d, 2w or a date like 2024-05-01")
    return stamp


def script_of(cmd: Any) -> str:
    """`--by script`'s key: the first script file the argv names, else `-m`'s module, else the program."""
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


def record_of(state: str, job: Job) -> JobRecord:
    """A job file's record (`state`: its directory)."""
    job_id = job.id if isinstance(job.id, int) and not isinstance(job.id, bool) else -1
    name = job.name if isinstance(job.name, str) else str(job_id)
    cwd = job.cwd if isinstance(job.cwd, str) else "?"
    return JobRecord(job_id, name, cwd, script_of(job.cmd), *facts(state, job))


def row_records(ids: Iterable[int], rows: Iterable[tuple]) -> list[JobRecord]:
    """The records of finished jobs from their index rows; an invalid job file has none."""
    valid = [(job_id, row) for job_id, row in zip(ids, rows) if row[6]]  # ROW's past: "" for no job
    return _records_of([(job_id, row[0], row[4], row[6]) for job_id, row in valid])


def kept_records(kept: Iterable[tuple]) -> list[JobRecord]:
    """The records of the jobs `gpuq clear` removed, from what it kept (spool/kept.py's RECORD)."""
    return _records_of([(record[0], record[2], record[3], record[5]) for record in kept])


def _records_of(jobs: list[tuple[int, str, str, Any]]) -> list[JobRecord]:
    """JobRecords of (id, name, command key, past) each, as runs.py writes the key and past."""
    commands = read_keys([key for _id, _name, key, _past in jobs])
    places = {key: (cwd if isinstance(cwd, str) else "?", script_of(cmd)) for key, (cmd, cwd) in commands.items()}
    pasts = read_pasts([past for _id, _name, _key, past in jobs])
    return [JobRecord(job_id, name, *places[key], *facts) for (job_id, name, key, _past), facts in zip(jobs, pasts)]


def _records(jobs: Iterable[Union[JobPair, JobRecord]]) -> Iterable[JobRecord]:
    for item in jobs:
        yield item if isinstance(item, JobRecord) else record_of(*item)


def runs(jobs: Iterable[Union[JobPair, JobRecord]]) -> list[PastRun]:
    """Every run of every job, ordered by start time (then job id, attempt)."""
    result = [
        PastRun(r.job_id, r.name, r.cwd, r.script, number, start, end, outcome, tuple(gpus), count, r.sweep, r.adopted)
        for r in _records(jobs)
        for number, start, end, outcome, gpus, count in (attempt[:6] for attempt in r.attempts)
    ]
    result.sort(key=lambda r: (r.start, r.job_id, r.attempt if r.attempt is not None else -1))
    return result


def _key(by: str, record: JobRecord, stamp: float) -> Union[int, str, None]:
    if by == "day":
        return datetime.fromtimestamp(stamp).strftime("%Y-%m-%d")  # the local calendar day
    return record.cwd if by == "dir" else record.script if by == "script" else record.sweep


def _order(key: Union[int, str, None]) -> tuple:
    # None (jobs outside any sweep) last; ints before strings so sweep ids sort numerically.
    if key is None:
        return (2, 0, "")
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def summarize(jobs: Iterable[Union[JobPair, JobRecord]], since: Optional[float] = None, by: str = "dir") -> list[Group]:
    """Per-group totals of the runs that ended at or after `since` (None: all), grouped `by` one of
    GROUP_KEYS ("day": the local day it ended), sorted by key (None last); the median over all runs."""
    if by not in GROUP_KEYS:
        raise ValueError(f"--by {by!r}: choose one of {', '.join(GROUP_KEYS)}")
    groups: dict[Union[int, str, None], Group] = {}
    for record in _records(jobs):
        for attempt in record.attempts:
            end = attempt[2]
            if since is None or end >= since:
                key = _key(by, record, end)
                _add_run(groups[key] if key in groups else groups.setdefault(key, Group(key)), record, attempt)
        for at in record.preempted:
            if since is None or at >= since:
                key = _key(by, record, at)
                groups.setdefault(key, Group(key)).preempted += 1
    for group in groups.values():
        group.median_seconds = median(group._seconds) if group._seconds else None
        group.jobs = len(group._job_ids)
    return [groups[key] for key in sorted(groups, key=_order)]


def job_ids(group: Group) -> list[int]:
    return sorted(group._job_ids)


def _add_run(group: Group, record: JobRecord, attempt: list[Any]) -> None:
    """One run (an item of `record.attempts`) into its group's totals, as PastRun counts it."""
    number, start, end, outcome, _gpus, gpu_count = attempt[:6]
    group.runs += 1
    group._job_ids.add(record.job_id)
    counter = COUNTERS.get(outcome)
    if counter:
        setattr(group, counter, getattr(group, counter) + 1)
    if counter == FAILED:
        reason = attempt[6] if len(attempt) > 6 else None
        group.failures.append({"id": record.job_id, "attempt": number, "reason": reason})
    group.adopted += record.adopted
    seconds = max(0.0, end - start)
    group.gpu_hours += seconds * gpu_count / 3600.0
    group._seconds.append(seconds)
    group.first = start if group.first is None or start < group.first else group.first
    group.last = end if group.last is None or end > group.last else group.last


def iso(stamp: Optional[float]) -> Optional[str]:
    """Epoch seconds -> ISO 8601 in local time with its offset, as job files hold times."""
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).astimezone().isoformat(timespec="seconds")


def to_json(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """`history --json`: one object per group, times ISO 8601."""
    return [
        {
            "key": group.key,
            **{field: getattr(group, field) for field in COUNTS},
            "gpu_hours": round(group.gpu_hours, 3),
            "median_seconds": None if group.median_seconds is None else round(group.median_seconds, 1),
            "first": iso(group.first),
            "last": iso(group.last),
            "gpu_use": group.gpu_use,
            "failures": group.failures,
        }
        for group in groups
    ]
