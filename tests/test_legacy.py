"""Reading the original single-file gpuq's queue: a real WAL database and a real queue.json, written
the way the original writes them (same table, same value encodings), with real processes for the
jobs it recorded as running."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from gpuq.core.errors import GpuqError
from gpuq.engine.original.reader import (
    LegacyError,
    LegacyJob,
    find_legacy,
    read_queue,
    retire_plan,
)

# A zone with daylight saving time, given as a POSIX rule so no tz database is needed: a winter
# time must come back as -05:00 and a summer one as -04:00.
ZONE = "EST5EDT,M3.2.0,M11.1.0"

# The original's table, as its code creates it (column order and defaults included).
ORIGINAL_TABLE = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, script TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '[]', python TEXT NOT NULL DEFAULT 'python3', cwd TEXT NOT NULL,
    env TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL DEFAULT 'pending', after_job INTEGER,
    retries INTEGER NOT NULL DEFAULT 0, attempt INTEGER NOT NULL DEFAULT 0, pid INTEGER,
    added_at TEXT, started_at TEXT, finished_at TEXT, exit_code INTEGER, log_file TEXT
);
"""

# Runs in a child process: writes the rows like the original (a connection with WAL on, an INSERT
# per job with args/env as JSON text, then the log name from the new id), then dies without
# closing, as a killed or rebooted gpuq would: the committed rows stay in gpuq.db-wal.
WRITER = r"""
import json, os, sqlite3, sys
from pathlib import Path
db_path, table, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
db = sqlite3.connect(db_path, timeout=10)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA foreign_keys=ON")
db.executescript(table)
log_dir = Path(db_path).parent / "logs"
for row in spec["rows"]:
    cur = db.execute(
        "INSERT INTO jobs (name, script, args, python, cwd, env, status, after_job, retries, attempt,"
        " pid, added_at, started_at, finished_at, exit_code, log_file)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')",
        (row["name"], row["script"], row.get("args_text", json.dumps(row["args"])), row["python"], row["cwd"],
         json.dumps(row["env"]), row["status"], row["after"], row["retries"], row["attempt"], row["pid"],
         row["added_at"], row["started_at"], row["finished_at"], row["exit_code"]),
    )
    log = str(log_dir / f"job_{cur.lastrowid:03d}_{Path(row['script']).stem}.log")
    db.execute("UPDATE jobs SET log_file = ? WHERE id = ?", (log, cur.lastrowid))
    db.commit()
for job_id in spec["cleared"]:
    db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    db.commit()
os._exit(0)
"""


@pytest.fixture
def zone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", ZONE)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def local(naive: str) -> str:
    """What a naive local time of the original must become (the zone is the test's)."""
    return datetime.fromisoformat(naive).astimezone().isoformat()


def row(name: str, script: str, cwd: Path, **fields) -> dict:
    base = dict(
        name=name, script=script, args=[], python="python3", cwd=str(cwd), env={}, status="pending", after=None,
        retries=0, attempt=0, pid=None, added_at="2025-01-15T09:00:00.123456", started_at=None, finished_at=None,
        exit_code=None,
    )  # fmt: skip
    return dict(base, **fields)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def original_db(tmp_path: Path, zone):
    """~/.gpuq of the original's SQLite version: ten jobs added (one later cleared) and one row
    damaged by hand; job 3 ran as a process that is gone, job 4 runs as a live process."""
    home = tmp_path / ".gpuq"
    (home / "logs").mkdir(parents=True)
    exp = tmp_path / "exp05"
    exp.mkdir()
    venv_python = str(exp / ".venv" / "bin" / "python")
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names nothing now
    started_live = datetime.now().isoformat()  # the original takes the time, then forks the job
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    rows = [
        row("exp05/train", "train.py", exp, args=["--lr", "1e-4", "--note", "two words"], python=venv_python,
            env={"WANDB_MODE": "offline", "SEED": "3"}, status="done", attempt=1,
            started_at="2025-01-15T09:00:01", finished_at="2025-07-01T12:30:00.500000", exit_code=0),
        row("exp05/eval", "eval.py", exp, after=1),
        row("exp05/sweep", "sweep.py", exp, status="running", attempt=1, pid=dead.pid,
            started_at="2025-01-16T08:00:00"),
        row("live", "serve.py", exp, status="running", attempt=1, pid=live.pid, started_at=started_live),
        row("exp05/old", "old.py", exp, status="cancelled"),
        row("exp05/flaky", "flaky.py", exp, status="failed", retries=1, attempt=2, started_at="2025-01-17T10:00:00",
            finished_at="2025-01-17T10:05:00", exit_code=2),
        row("exp05/long", "long.py", exp, args=["--max_steps", "300"], status="preempted", attempt=1,
            started_at="2025-01-18T10:00:00", finished_at="2025-01-18T11:00:00"),
        row("exp05/gone", "gone.py", exp, status="done", attempt=1, exit_code=0),
        row("exp05/after-gone", "report.py", exp, after=8),
        row("exp05/oom", "big.py", exp, status="failed", attempt=1, exit_code=-9),
        row("hand-edited", "x.py", exp, args_text="[not json"),
    ]  # fmt: skip
    spec = {"rows": rows, "cleared": [8]}
    subprocess.run([sys.executable, "-c", WRITER, str(home / "gpuq.db"), ORIGINAL_TABLE, json.dumps(spec)], check=True)
    try:
        yield home, exp, dead.pid, live, started_live
    finally:
        live.kill()
        live.wait()


def test_sqlite_queue_reads_every_field(original_db):
    home, exp, dead_pid, live, started_live = original_db
    db = home / "gpuq.db"
    assert (home / "gpuq.db-wal").stat().st_size > 0, "the rows must still be in the -wal for this test"
    before = {p.name: digest(p) for p in (db, home / "gpuq.db-wal")}

    queue = read_queue(db)

    assert {p.name: digest(p) for p in (db, home / "gpuq.db-wal")} == before, "the database was modified"
    assert queue.source_path == db and queue.kind == "sqlite"
    assert queue.next_id == 12  # 11 rows given ids 1..11; 8 was cleared, its id is never given again
    assert len(queue.fingerprint) == 64
    logs = home / "logs"
    common = dict(cwd=str(exp), env={}, after=[], retries=0, attempts=0, pid=None, pid_create_time=None,
                  created_at="2025-01-15T09:00:00.123456-05:00", started_at=None, finished_at=None, exit_code=None,
                  signal=None, notes=[])  # fmt: skip
    expected = [
        LegacyJob(**dict(common, id=1, name="exp05/train",
                         cmd=[str(exp / ".venv/bin/python"), "-u", "train.py", "--lr", "1e-4", "--note", "two words"],
                         env={"WANDB_MODE": "offline", "SEED": "3"}, status="done", legacy_status="done", attempts=1,
                         started_at="2025-01-15T09:00:01-05:00", finished_at="2025-07-01T12:30:00.500000-04:00",
                         exit_code=0, log_file=str(logs / "job_001_train.log"))),
        LegacyJob(**dict(common, id=2, name="exp05/eval", cmd=["python3", "-u", "eval.py"], status="pending",
                         legacy_status="pending", after=[1], log_file=str(logs / "job_002_eval.log"))),
        LegacyJob(**dict(common, id=3, name="exp05/sweep", cmd=["python3", "-u", "sweep.py"], status="interrupted",
                         legacy_status="running", attempts=1, pid=dead_pid, started_at="2025-01-16T08:00:00-05:00",
                         log_file=str(logs / "job_003_sweep.log"),
                         notes=[f"was running as process {dead_pid}, which is gone (or is not the job's); "
                                "taken as interrupted"])),
        LegacyJob(**dict(common, id=4, name="live", cmd=["python3", "-u", "serve.py"], status="running",
                         legacy_status="running", attempts=1, pid=live.pid,
                         pid_create_time=psutil.Process(live.pid).create_time(), started_at=local(started_live),
                         log_file=str(logs / "job_004_serve.log"))),
        LegacyJob(**dict(common, id=5, name="exp05/old", cmd=["python3", "-u", "old.py"], status="cancelled",
                         legacy_status="cancelled", log_file=str(logs / "job_005_old.log"))),
        LegacyJob(**dict(common, id=6, name="exp05/flaky", cmd=["python3", "-u", "flaky.py"], status="failed",
                         legacy_status="failed", retries=1, attempts=2, started_at="2025-01-17T10:00:00-05:00",
                         finished_at="2025-01-17T10:05:00-05:00", exit_code=2,
                         log_file=str(logs / "job_006_flaky.log"))),
        LegacyJob(**dict(common, id=7, name="exp05/long", cmd=["python3", "-u", "long.py", "--max_steps", "300"],
                         status="preempted", legacy_status="preempted", attempts=1,
                         started_at="2025-01-18T10:00:00-05:00", finished_at="2025-01-18T11:00:00-05:00",
                         log_file=str(logs / "job_007_long.log"))),
        LegacyJob(**dict(common, id=9, name="exp05/after-gone", cmd=["python3", "-u", "report.py"],
                         status="pending", legacy_status="pending", log_file=str(logs / "job_009_report.log"),
                         notes=["waited for job 8, which is no longer in the queue (the original ran it anyway)"])),
        LegacyJob(**dict(common, id=10, name="exp05/oom", cmd=["python3", "-u", "big.py"], status="failed",
                         legacy_status="failed", attempts=1, exit_code=137, signal="SIGKILL",
                         log_file=str(logs / "job_010_big.log"))),
    ]  # fmt: skip
    assert queue.jobs == expected
    assert [(p.id, p.reason) for p in queue.problems] == [(11, "args is not valid JSON: '[not json'")]
    assert queue.problems[0].raw["name"] == "hand-edited"  # the whole row is kept for the report


def test_wal_rows_are_not_in_the_main_file_alone(original_db, tmp_path: Path):
    """Proves the test above reads the -wal: the main file without it holds none of the jobs."""
    home = original_db[0]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(home / "gpuq.db", alone / "gpuq.db")
    with pytest.raises(LegacyError, match="no table 'jobs'"):  # even the table is only in the -wal
        read_queue(alone / "gpuq.db")


def test_the_bak_copy_has_the_same_fingerprint_whatever_the_processes_do(original_db):
    home, _exp, _dead, live, _started = original_db
    first = read_queue(home / "gpuq.db")
    plan = retire_plan(home / "gpuq.db")
    assert plan == [
        (home / "gpuq.db-wal", home / "gpuq.db.bak-wal"),
        (home / "gpuq.db-shm", home / "gpuq.db.bak-shm"),
        (home / "gpuq.db", home / "gpuq.db.bak"),
    ]
    for source, target in plan:
        os.rename(source, target)
    live.kill()
    live.wait()
    assert find_legacy(home) is None  # a .bak is never picked up by itself
    again = read_queue(home / "gpuq.db.bak")
    assert again.fingerprint == first.fingerprint
    assert [j.id for j in again.jobs] == [j.id for j in first.jobs]
    assert [j.status for j in again.jobs if j.id == 4] == ["interrupted"]  # its process is gone now


def test_a_changed_queue_has_another_fingerprint(tmp_path: Path):
    def write(jobs: list) -> str:
        path = tmp_path / "queue.json"
        path.write_text(json.dumps({"next_id": len(jobs) + 1, "jobs": jobs}, indent=2, default=str))
        return read_queue(path).fingerprint

    job = {"id": 1, "name": "a", "script": "a.py", "args": [], "python": "python3", "cwd": "/tmp", "env": {},
           "status": "pending", "after": None, "retries": 0, "attempt": 0}  # fmt: skip
    first = write([job])
    assert write([job]) == first
    assert write([dict(job, status="done")]) != first


def test_json_queue_of_the_first_version(tmp_path: Path, zone):
    home = tmp_path / ".gpuq"
    home.mkdir()
    exp = tmp_path / "exp01"
    (exp / ".venv" / "bin").mkdir(parents=True)
    (exp / ".venv" / "bin" / "python").write_text("")
    logs = home / "logs"
    state = {
        "next_id": 6,
        "jobs": [
            {"id": 1, "name": "exp01/train", "script": "train.py", "args": ["--tag", "a b"], "python": "python3",
             "cwd": str(exp), "env": {"CUDA_VISIBLE_DEVICES": "1"}, "status": "running", "after": None,
             "retries": 2, "attempt": 1, "added_at": "2025-03-01T10:00:00", "started_at": "2025-03-01T10:00:05.250000",
             "finished_at": None, "exit_code": None, "log_file": str(logs / "job_001_train.log")},
            {"id": 3, "script": "eval.py", "args": [], "cwd": str(exp), "env": {}, "status": "pending",
             "after": 1, "retries": 0, "attempt": 0, "added_at": "2025-03-20T10:00:00", "started_at": None,
             "finished_at": None, "exit_code": None, "log_file": str(logs / "job_003_eval.log")},
            {"id": 4, "name": "weird", "script": "w.py", "args": [], "python": "python3", "cwd": str(exp),
             "env": {}, "status": "paused", "after": None, "retries": 0, "attempt": 0, "added_at": None,
             "started_at": None, "finished_at": None, "exit_code": None, "log_file": ""},
            "garbage",
            {"id": 5, "name": "no-cwd", "script": "x.py", "status": "pending"},
        ],
    }  # fmt: skip
    (home / "queue.json").write_text(json.dumps(state, indent=2, default=str))
    assert find_legacy(home) == home / "queue.json"

    queue = read_queue(home / "queue.json")

    assert (queue.kind, queue.next_id) == ("json", 6)
    assert queue.jobs == [
        LegacyJob(id=1, name="exp01/train", cmd=["python3", "-u", "train.py", "--tag", "a b"], cwd=str(exp),
                  env={"CUDA_VISIBLE_DEVICES": "1"}, status="interrupted", legacy_status="running", after=[],
                  retries=2, attempts=1, pid=None, pid_create_time=None, created_at="2025-03-01T10:00:00-05:00",
                  started_at="2025-03-01T10:00:05.250000-05:00", finished_at=None, exit_code=None, signal=None,
                  log_file=str(logs / "job_001_train.log"),
                  notes=["was running, but no process id was recorded; taken as interrupted"]),
        LegacyJob(id=3, name="exp01/eval", cmd=[str(exp / ".venv/bin/python"), "-u", "eval.py"], cwd=str(exp),
                  env={}, status="pending", legacy_status="pending", after=[1], retries=0, attempts=0, pid=None,
                  pid_create_time=None, created_at="2025-03-20T10:00:00-04:00", started_at=None, finished_at=None,
                  exit_code=None, signal=None, log_file=str(logs / "job_003_eval.log"),
                  notes=[f"no interpreter recorded; {exp / '.venv/bin/python'} chosen as the original's `add` would"]),
        LegacyJob(id=4, name="weird", cmd=["python3", "-u", "w.py"], cwd=str(exp), env={}, status="interrupted",
                  legacy_status="paused", after=[], retries=0, attempts=0, pid=None, pid_create_time=None,
                  created_at=None, started_at=None, finished_at=None, exit_code=None, signal=None, log_file=None,
                  notes=["unknown state 'paused'; taken as interrupted"]),
    ]  # fmt: skip
    assert [(p.id, p.reason) for p in queue.problems] == [(None, "not an object"), (5, "no working directory")]
    assert queue.problems[0].raw == {"value": "garbage"}


def test_find_legacy_prefers_the_database_and_ignores_bak(tmp_path: Path):
    assert find_legacy(tmp_path) is None
    (tmp_path / "queue.json.bak").write_text('{"next_id": 1, "jobs": []}')
    (tmp_path / "gpuq.db.bak").write_bytes(b"")
    assert find_legacy(tmp_path) is None
    (tmp_path / "queue.json").write_text('{"next_id": 1, "jobs": []}')
    assert find_legacy(tmp_path) == tmp_path / "queue.json"
    (tmp_path / "gpuq.db").write_bytes(b"")
    assert find_legacy(tmp_path) == tmp_path / "gpuq.db"
    # the original's own migration left queue.json.bak: a new backup must not replace it
    assert retire_plan(tmp_path / "queue.json") == [(tmp_path / "queue.json", tmp_path / "queue.json.bak.1")]


def test_files_that_are_not_an_original_queue(tmp_path: Path):
    import sqlite3

    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE notes (id INTEGER)")
    db.commit()
    db.close()
    cases = {
        other: "is an SQLite database but not the original gpuq's (no table 'jobs')",
        tmp_path / "text": "is not a queue of the original gpuq (neither SQLite nor JSON)",
        tmp_path / "list.json": "is JSON but not the original gpuq's queue (no list 'jobs')",
        tmp_path / "missing": "cannot read",
    }
    (tmp_path / "text").write_text("hello\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, words in cases.items():
        with pytest.raises(LegacyError) as caught:
            read_queue(path)
        assert words in str(caught.value) and "\n" not in str(caught.value)
        assert isinstance(caught.value, GpuqError) and caught.value.exit_code == 1
