"""What `gpuq history` and the queue's ETA read of a job: its command key, its run time and its
runs, as data a finished job's row holds (journal.py's ROW: `key`, `run`, `past`).

`gpuq status` with jobs waiting needed, on every call, the run times of earlier runs of the same
commands, and `gpuq history` every attempt of every finished job: both parsed the job files
(200, and all of them; issue 27). So the row of a finished job, made once from the bytes written
(journal.py), holds them too, and those commands read rows. The rules are here, below the
engine, because the row is made where the file is written (spool/store.py); engine/views/history.py
applies the same rules to the jobs that are not finished, so both give the same figures.

Tolerant, as history always was: a bad field in one job file gives an unknown (a run left out, a
default), never an error. `job` is a job file's dict (core/shown.py's parse) or a core.job.Job;
an absent field reads as its default of core/job.py.
"""

from __future__ import annotations

from gpuq.core import jsontext
from gpuq.core.times import datetime

TYPE_CHECKING = False  # typing only for annotations: `status` imports this (tests/test_startup_imports.py)
if TYPE_CHECKING:
    from typing import Any, Optional, Union


# The fields of a job these rules read, beyond journal.READS (which core/shown.py checks): read
# as they are, an unexpected value an unknown, so that `status -a` shows what it always showed.
READS = ("cwd", "adopted", "sweep", "gpu_request", "gpus", "slot", "attempts", "history", "preemptions")


def command_key(cmd: Any, cwd: Any) -> str:
    """What makes two runs the same for the ETA: the command and its directory, as a JSON text
    (history reads them back from it: few distinct keys, each decoded once)."""
    return jsontext.dumps([list(cmd) if isinstance(cmd, (list, tuple)) else cmd, cwd])


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


def run_seconds(job: dict[str, Any]) -> Optional[float]:
    """The job's run time for the ETA: finished minus started; None when either is unknown, the
    end comes first, or the job was adopted (its times are only approximate)."""
    if job.get("adopted"):
        return None
    start, end = parse_time(job.get("started_at")), parse_time(job.get("finished_at"))
    return end - start if start is not None and end is not None and end >= start else None


def _gpus_of(record: dict[str, Any]) -> Optional[list[str]]:
    gpus = record.get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in gpus):
        return [str(g) for g in gpus]
    slot = record.get("slot")
    if isinstance(slot, str) and slot.strip():
        return [part.strip() for part in slot.split(",") if part.strip()]
    return None


def gpus_held(job: dict[str, Any], attempt: Optional[dict[str, Any]] = None) -> tuple[list[str], int]:
    """(GPU indices, GPU count) of an attempt of `job`: the attempt's own `gpus`/`slot` if it
    recorded them, else the job's; `gpus` (non-empty) wins over `slot` ("0,1"), which wins over
    `gpu_request` (default 1). `gpu_request: 0` is a CPU job: 0 GPUs, whatever else is recorded."""
    request = job.get("gpu_request", 1)
    if not isinstance(request, int) or isinstance(request, bool) or request < 0:
        request = 1
    if request == 0:
        return [], 0
    gpus = (_gpus_of(attempt) if attempt else None) or _gpus_of(job)
    if gpus:
        return gpus, len(gpus)
    return [], request


def sweep_id(job: dict[str, Any]) -> Optional[Union[int, str]]:
    sweep = job.get("sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("id"), (int, str)) and not isinstance(sweep.get("id"), bool):
        return sweep["id"]
    return None


def _attempts(state: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    history = job.get("history")
    entries = [entry for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []
    if entries:
        return entries
    # Files from before `history` existed: the job's own fields describe its one attempt.
    return [
        {
            "attempt": job.get("attempts", 0),
            "started_at": job.get("started_at"),
            "finished_at": job.get("finished_at"),
            "outcome": state,
        }
    ]


def attempts(state: str, job: dict[str, Any]) -> list[list[Any]]:
    """[attempt (None: unknown), start, end, outcome, GPUs, GPU count] of each attempt with a known
    start and end, in attempt order; the outcome is `state` where the attempt does not say."""
    out = []
    for entry in _attempts(state, job):
        start, end = parse_time(entry.get("started_at")), parse_time(entry.get("finished_at"))
        if start is None or end is None:
            continue
        gpus, count = gpus_held(job, entry)
        number = entry.get("attempt")
        outcome = entry.get("outcome")
        out.append(
            [
                number if isinstance(number, int) else None,
                start,
                end,
                outcome if isinstance(outcome, str) else state,
                gpus,
                count,
            ]
        )
    return out


def preemption_times(job: dict[str, Any]) -> list[float]:
    """When the job was preempted (epoch seconds), from its `preemptions` records."""
    records = job.get("preemptions")
    if not isinstance(records, list):
        return []
    times = (parse_time(record.get("at")) for record in records if isinstance(record, dict))
    return [at for at in times if at is not None]


def facts(state: str, job: dict[str, Any]) -> list[Any]:
    """What history reads of a job besides its key: [sweep id, adopted, attempts, preemption times]."""
    return [sweep_id(job), bool(job.get("adopted")), attempts(state, job), preemption_times(job)]


def past_text(state: str, job: dict[str, Any]) -> str:
    """A row's `past`: the job's facts as one JSON text, parsed only by `gpuq history` (a row is
    unpacked by every `status -a` that refreshes it: a string is one object, the facts dozens)."""
    return jsontext.dumps(facts(state, job))


def read_pasts(texts: list[str]) -> list[list[Any]]:
    """The facts of many rows' `past` texts: one parse of them all (one by one if that fails: a
    damaged one reads as no runs)."""
    return _read_all(texts, [None, False, [], []], _is_past)


def read_keys(keys: list[str]) -> dict[str, tuple[Any, Any]]:
    """key -> (cmd, cwd) of each distinct command key (a damaged one: ("?", "?"))."""
    distinct = list(dict.fromkeys(keys))
    return dict(zip(distinct, map(tuple, _read_all(distinct, ["?", "?"], _is_key))))


def _read_all(texts: list[str], damaged: list[Any], valid: Any) -> list[Any]:
    try:
        values = jsontext.loads("[" + ",".join(texts) + "]") if texts else []
        if len(values) == len(texts) and all(map(valid, values)):
            return values
    except (ValueError, RecursionError):
        pass
    return [_read_one(text, damaged, valid) for text in texts]


def _read_one(text: str, damaged: list[Any], valid: Any) -> Any:
    try:
        value = jsontext.loads(text)
    except (ValueError, RecursionError):
        return damaged
    return value if valid(value) else damaged


def _is_key(value: Any) -> bool:
    return type(value) is list and len(value) == 2


def _is_past(value: Any) -> bool:
    """The shape past_text writes (its parts are not checked one by one: 10,000 rows per history;
    a journal line is gpuq's own, tagged, and whole)."""
    return type(value) is list and len(value) == 4 and type(value[2]) is list and type(value[3]) is list
