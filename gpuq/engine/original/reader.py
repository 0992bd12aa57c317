"""Reading the queue of the original single-file gpuq (`~/.gpuq/gpuq.db`, SQLite, or `queue.json`) as
plain data: each row a `LegacyJob`, or a `LegacyProblem` saying why not. Nothing here writes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import psutil

from gpuq.core.errors import GpuqError
from gpuq.core.job import MAX_ID, is_int
from gpuq.core.states import CANCELLED, DONE, FAILED, INTERRUPTED, PENDING, PREEMPTED, RUNNING
from gpuq.engine.schedule.scheduler import dependency_loops, loop_reason
from gpuq.spool.layout import find_legacy

__all__ = ["find_legacy"]  # spool.layout's, kept importable from here too
SQLITE_MAGIC = b"SQLite format 3\x00"
# The states the original wrote; `preempted` came with its `preempt` command.
KNOWN_STATES = (PENDING, RUNNING, DONE, FAILED, CANCELLED, INTERRUPTED, PREEMPTED)  # spelled as ours
# The original recorded started_at just before it forked the job, so the job's process was created
# a moment after it; a process created later than this is another one that reused the pid.
START_SLACK_SECONDS = 30.0
# Columns every version of its table has (pid came later: older tables lack it).
REQUIRED_COLUMNS = {"id", "name", "script", "args", "python", "cwd", "env", "status", "after_job"}


class LegacyError(GpuqError):
    """The file is not a queue of the original gpuq (or cannot be read at all)."""


@dataclass
class LegacyJob:
    id: int
    name: str
    cmd: list[str]  # argv exactly as the original ran it, to be run in `cwd`
    cwd: str
    env: dict[str, str]  # its own, not the original's defaults (CUDA_VISIBLE_DEVICES=0 would fight gpuq's)
    status: str  # one of KNOWN_STATES, already decided for running jobs (see read_queue)
    legacy_status: str  # what the file said
    after: list[int]  # ids it waited for, satisfied by any end: the spool's `after_any`
    retries: int
    attempts: int
    pid: Optional[int]
    pid_create_time: Optional[float]  # set only when status is "running": its live process
    created_at: Optional[str]  # ISO 8601 with the local offset
    started_at: Optional[str]
    finished_at: Optional[str]
    exit_code: Optional[int]  # 128+N when killed by signal N, as in the spool
    signal: Optional[str]  # "SIGKILL"... when a signal ended it
    log_file: Optional[str]  # absolute path, or None
    notes: list[str] = field(default_factory=list)  # what was changed on the way, in words


@dataclass
class LegacyProblem:
    id: Optional[int]
    reason: str
    raw: dict[str, Any]  # the row as read, so nothing is lost


@dataclass
class LegacyQueue:
    source_path: Path
    kind: str  # "sqlite" or "json"
    fingerprint: str  # sha256 of the canonical content: equal for a file and its renamed copy
    next_id: int  # larger than every id the original ever gave out
    jobs: list[LegacyJob]
    problems: list[LegacyProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was changed of the queue as a whole, in words


def read_queue(path: Path) -> LegacyQueue:
    """Read an original gpuq queue (`gpuq.db`, `queue.json`, or a renamed copy), its kind told by
    content. A job recorded as running stays so only if its pid is a live process of this user
    created no later than its start; else it is interrupted. LegacyError for no such queue."""
    path = Path(path).absolute()
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise LegacyError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head == SQLITE_MAGIC:
        kind, records, declared_next = "sqlite", *_read_sqlite(path)
    else:
        kind, records, declared_next = "json", *_read_json(path)
    fingerprint = _fingerprint(kind, records, declared_next)
    jobs, problems = _convert_all(records)
    notes = []
    if declared_next is not None and declared_next > MAX_ID:  # a counter no job id could follow
        notes.append(f"its next id {declared_next} is above {MAX_ID}, the largest a job may have; ignored")
        declared_next = None
    ids = [job.id for job in jobs] + [p.id for p in problems if p.id is not None]
    next_id = max([declared_next or 0, *(i + 1 for i in ids), 1])
    return LegacyQueue(path, kind, fingerprint, next_id, jobs, problems, notes)


def retire_plan(path: Path) -> list[tuple[Path, Path]]:
    """The renames that put an imported file out of the way, in order: `NAME` -> `NAME.bak` (or
    `.bak.1`...), after its `-wal` and `-shm`: a `-wal` left under the old name would be replayed
    into any new `gpuq.db` the original creates. Use no-replace renames."""
    path = Path(path)
    target = path.with_name(path.name + ".bak")
    n = 0
    while any(Path(str(target) + s).exists() for s in ("", "-wal", "-shm")):
        n += 1
        target = path.with_name(f"{path.name}.bak.{n}")
    moves = [(Path(str(path) + s), Path(str(target) + s)) for s in ("-wal", "-shm")]
    return [m for m in moves if m[0].exists()] + [(path, target)]


def _read_sqlite(path: Path) -> tuple[list[dict[str, Any]], Optional[int]]:
    try:
        # mode=ro: never written; unlike immutable=1 it still reads committed rows from the -wal.
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise LegacyError(f"cannot open {path} read-only: {exc}") from None
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "jobs" not in tables:
            raise LegacyError(f"{path} is an SQLite database but not the original gpuq's (no table 'jobs')")
        columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        missing = REQUIRED_COLUMNS - columns
        if missing:
            raise LegacyError(f"{path}: table 'jobs' is not the original gpuq's (no {', '.join(sorted(missing))})")
        cursor = db.execute("SELECT * FROM jobs ORDER BY id")
        names = [d[0] for d in cursor.description]
        records = [dict(zip(names, row)) for row in cursor]
        declared = None
        if "sqlite_sequence" in tables:  # AUTOINCREMENT: ids of cleared jobs are never given again
            seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
            declared = seq[0] + 1 if seq and isinstance(seq[0], int) else None
        return records, declared
    except sqlite3.Error as exc:
        raise LegacyError(f"cannot read {path}: {exc}") from None
    finally:
        db.close()


def _read_json(path: Path) -> tuple[list[Any], Optional[int]]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise LegacyError(f"{path} is not a queue of the original gpuq (neither SQLite nor JSON)") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise LegacyError(f"{path} is JSON but not the original gpuq's queue (no list 'jobs')")
    declared = data.get("next_id")
    return data["jobs"], declared if is_int(declared) else None


def _fingerprint(kind: str, records: list[Any], declared_next: Optional[int]) -> str:
    """sha256 over the content as read (not over what was decided about processes), with keys
    sorted, so a renamed copy of the same file always gives the same value."""
    payload = {"kind": kind, "next_id": declared_next, "jobs": records}
    plain = lambda value: value.hex() if isinstance(value, (bytes, bytearray)) else repr(value)  # noqa: E731
    text = json.dumps(payload, sort_keys=True, ensure_ascii=True, default=plain)
    return hashlib.sha256(("gpuq-legacy-1\n" + text).encode()).hexdigest()


class _Unreadable(Exception):
    """A row that cannot become a job; the message is the reason."""


def _convert_all(records: list[Any]) -> tuple[list[LegacyJob], list[LegacyProblem]]:
    jobs: list[LegacyJob] = []
    problems: list[LegacyProblem] = []
    seen: set[int] = set()
    for record in records:
        if not isinstance(record, dict):
            problems.append(LegacyProblem(None, "not an object", {"value": record}))
            continue
        raw_id: Any = record.get("id")
        job_id = raw_id if is_int(raw_id) and 0 < raw_id <= MAX_ID else None
        try:
            if job_id is None and is_int(raw_id) and raw_id > MAX_ID:
                raise _Unreadable(f"id {raw_id} is above {MAX_ID}, the largest a job may have")
            if job_id is None:
                raise _Unreadable(f"id {raw_id!r} is not a positive integer")
            if job_id in seen:
                raise _Unreadable(f"id {job_id} appears more than once; only its first row can be taken")
            jobs.append(_convert(record, job_id))
        except _Unreadable as exc:
            problems.append(LegacyProblem(job_id, str(exc), record))
        if job_id is not None:
            seen.add(job_id)
    for job in jobs:  # the original ran a job whose dependency was gone (cleared) as if it were met
        gone = [dep for dep in job.after if dep not in seen]
        for dep in gone:
            job.after.remove(dep)
            job.notes.append(f"waited for job {dep}, which is no longer in the queue (the original ran it anyway)")
    _note_loops(jobs)
    return jobs, problems


def _note_loops(jobs: list[LegacyJob]) -> None:
    """Pending jobs that wait for themselves through others (the original never started them
    either) are imported as they are, blocked; each says so."""
    waits = {job.id: job.after for job in jobs if job.status == PENDING}
    loops = dependency_loops(waits)
    for job in jobs:
        if job.id in loops:
            job.notes.append(f"{loop_reason(loops[job.id])}, so it will not start: `gpuq edit` or `gpuq cancel` it")


def _convert(record: dict[str, Any], job_id: int) -> LegacyJob:
    notes: list[str] = []
    cwd = _cwd(record.get("cwd"), notes)
    script = record.get("script")
    if not isinstance(script, str) or not script:
        raise _Unreadable("no script")
    args = [str(v) for v in _scalars(record, "args", [], "a list of words")]
    env = {str(k): str(v) for k, v in _scalars(record, "env", {}, "an object of strings").items()}
    python = record.get("python")
    if not isinstance(python, str) or not python:
        python = _venv_python(cwd)
        notes.append(f"no interpreter recorded; {python} chosen as the original's `add` would")
    legacy_status = record.get("status")
    if not isinstance(legacy_status, str):
        raise _Unreadable(f"status {legacy_status!r} is not a word")
    pid: Any = record.get("pid")
    pid = pid if is_int(pid) and pid > 0 else None
    started_at = _time(record.get("started_at"), "started_at", notes)
    exit_code, signal_name = _exit(record.get("exit_code"), notes)
    status, create_time = _state(legacy_status, pid, started_at, notes)
    return LegacyJob(
        id=job_id,
        name=_name(record, cwd, script),
        cmd=[python, "-u", script, *args],
        cwd=cwd,
        env=env,
        status=status,
        legacy_status=legacy_status,
        after=_after(record.get("after_job", record.get("after")), job_id),
        retries=_count(record.get("retries"), "retries", notes),
        attempts=_count(record.get("attempt"), "attempt", notes),
        pid=pid,
        pid_create_time=create_time,
        created_at=_time(record.get("added_at"), "added_at", notes),
        started_at=started_at,
        finished_at=_time(record.get("finished_at"), "finished_at", notes),
        exit_code=exit_code,
        signal=signal_name,
        log_file=_log_file(record.get("log_file"), notes),
        notes=notes,
    )


def _state(legacy: str, pid: Optional[int], started_at: Optional[str], notes: list[str]) -> tuple[str, Optional[float]]:
    if legacy not in KNOWN_STATES:
        # Interrupted is the state a person re-queues by hand: nothing lost, nothing started by itself.
        notes.append(f"unknown state {legacy!r}; taken as interrupted")
        return INTERRUPTED, None
    if legacy != RUNNING:
        return legacy, None
    if pid is None:
        notes.append("was running, but no process id was recorded; taken as interrupted")
        return INTERRUPTED, None
    create_time = _live_start(pid, started_at)
    if create_time is None:
        notes.append(f"was running as process {pid}, which is gone (or is not the job's); taken as interrupted")
        return INTERRUPTED, None
    return RUNNING, create_time


def _live_start(pid: int, started_at: Optional[str]) -> Optional[float]:
    """The create time of `pid` if it is alive, ours, not a zombie, and old enough to be the job."""
    if started_at is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or proc.uids().real != os.getuid():
            return None
        created = proc.create_time()
    except (psutil.Error, OSError):
        return None
    if created > datetime.fromisoformat(started_at).timestamp() + START_SLACK_SECONDS:
        return None  # the pid was given to a newer process
    return created


def _scalars(record: dict[str, Any], key: str, empty: Any, kind: str) -> Any:
    """record[key]: a list or object (as `empty` is) of strings or numbers; null reads as empty."""
    value = record.get(key, empty)
    if isinstance(value, str):  # SQLite keeps args and env as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise _Unreadable(f"{key} is not valid JSON: {value[:80]!r}") from None
    if value is None:
        return empty
    items = value.values() if isinstance(value, dict) else value
    if type(value) is not type(empty) or not all(_is_scalar(v) for v in items):  # the type first
        raise _Unreadable(f"{key} is not {kind}")
    return value


def _cwd(value: Any, notes: list[str]) -> str:
    if not isinstance(value, str) or not value:
        raise _Unreadable("no working directory")
    if os.path.isabs(value):
        return value
    resolved = os.path.join(os.path.expanduser("~"), value)
    notes.append(f"working directory {value!r} was relative; taken from the home directory: {resolved}")
    return os.path.normpath(resolved)


def _venv_python(cwd: str) -> str:
    """The interpreter the original's `add` would have recorded for `cwd`."""
    for folder in (Path(cwd), Path(cwd).parent):
        candidate = folder / ".venv" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    return "python3"


def _name(record: dict[str, Any], cwd: str, script: str) -> str:
    for key in ("name", "exp"):  # its very first jobs were called "exp"
        if isinstance(record.get(key), str) and record[key]:
            return record[key]
    return f"{Path(cwd).name}/{Path(script).stem}"


def _after(value: Any, job_id: int) -> list[int]:
    if value is None or value == 0 or value == "":
        return []
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not is_int(value) or value < 0:
        raise _Unreadable(f"waits for {value!r}, which is not a job id")
    if value == job_id:
        raise _Unreadable("waits for itself, so the original could never start it")
    return [value]


def _count(value: Any, what: str, notes: list[str]) -> int:
    if value is None:
        return 0
    if is_int(value) and value >= 0:
        return value
    notes.append(f"{what} {value!r} is not a count; taken as 0")
    return 0


def _time(value: Any, what: str, notes: list[str]) -> Optional[str]:
    """A stored time as ISO 8601 with an offset; naive ones are this machine's local time."""
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        notes.append(f"{what} {value!r} is not a time; left empty")
        return None
    return moment.astimezone().isoformat()


def _exit(value: Any, notes: list[str]) -> tuple[Optional[int], Optional[str]]:
    """The original kept Popen's returncode: -N for death by signal N, and -1 also when it could
    not start the job at all. The spool says 128+N and names the signal."""
    if value is None:
        return None, None
    if not is_int(value):
        notes.append(f"exit code {value!r} is not a number; left empty")
        return None, None
    if value == -1:
        notes.append("exit code -1: the original could not start it, or it died of SIGHUP; left empty")
        return None, None
    if value < 0:
        try:
            name = signal.Signals(-value).name
        except ValueError:
            name = None
        return 128 - value, name
    return value, None


def _log_file(value: Any, notes: list[str]) -> Optional[str]:
    if not isinstance(value, str) or not value:
        return None
    if not os.path.isabs(value):
        notes.append(f"log file {value!r} was relative to a directory nobody recorded; not kept")
        return None
    return value


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)
