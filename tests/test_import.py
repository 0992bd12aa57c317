"""Importing the original gpuq's queue into the spool (issue 12): a WAL database and a queue.json
written exactly as the original writes them, imported on first use and with `gpuq import`, never
twice, losing nothing; imported pending jobs then run under a real worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import Env
from test_legacy import ORIGINAL_TABLE, WRITER, row

EVAL = """import json, os, sys
open("eval-ran.json", "w").write(json.dumps({"argv": sys.argv[1:], "seed": os.environ.get("SEED")}))
"""


def original_queue(gq: Env) -> Path:
    """The original gpuq's ~/.gpuq, which here is gpuq's own spool directory, as its users have it."""
    home = gq.home
    (home / "logs").mkdir(parents=True)
    exp = gq.work / "exp05"
    exp.mkdir()
    (exp / "eval.py").write_text(EVAL)
    dead = subprocess.Popen(["true"])
    dead.wait()
    py = sys.executable
    rows = [
        row("exp05/train", "train.py", exp, python=py, status="done", attempt=1, exit_code=0,
            started_at="2025-01-15T09:00:01", finished_at="2025-01-15T10:00:00"),
        row("exp05/eval", "eval.py", exp, python=py, after=1, args=["--note", "two words"], env={"SEED": "3"}),
        row("exp05/sweep", "sweep.py", exp, python=py, status="running", attempt=1, pid=dead.pid,
            started_at="2025-01-16T08:00:00"),
        row("exp05/old", "old.py", exp, python=py, status="cancelled"),
        row("exp05/flaky", "flaky.py", exp, python=py, status="failed", attempt=2, exit_code=2,
            started_at="2025-01-17T10:00:00", finished_at="2025-01-17T10:05:00"),
    ]  # fmt: skip
    spec = {"rows": rows, "cleared": []}
    subprocess.run([py, "-c", WRITER, str(home / "gpuq.db"), ORIGINAL_TABLE, json.dumps(spec)], check=True)
    (home / "logs" / "job_001_train.log").write_text("step 300/300\ntrained\n")
    return exp


def spool_listing(gq: Env) -> dict[str, list[str]]:
    return {state: gq.files(state) for state in ("pending", "running", "done", "failed", "cancelled", "interrupted")}


def test_first_use_imports_the_database_and_its_jobs_run(gq: Env) -> None:
    exp = original_queue(gq)
    proc = gq.gpuq("status", "--json")
    assert json.loads(proc.stdout)  # stdout stays JSON: what the import says goes to stderr
    assert "imported the original gpuq's queue" in proc.stderr and "renamed gpuq.db -> gpuq.db.bak" in proc.stderr
    assert not (gq.home / "gpuq.db").exists() and (gq.home / "gpuq.db.bak").exists()

    states = {job_id: gq.state_of(job_id) for job_id in range(1, 6)}
    assert states == {1: "done", 2: "pending", 3: "interrupted", 4: "cancelled", 5: "failed"}
    assert gq.job(5)["exit_code"] == 2 and gq.job(1)["started_at"].startswith("2025-01-15T09:00:01")
    eval_job = gq.job(2)
    assert eval_job["after_any"] == [1] and eval_job["env"] == {"SEED": "3"}
    assert eval_job["cmd"][-3:] == ["eval.py", "--note", "two words"]
    assert "trained" in gq.gpuq("log", "1").stdout  # the old log stays readable
    assert gq.add("--after", "5", str(exp / "eval.py")) == 6  # new ids come after the old ones

    gq.gpuq("cancel", "6")
    gq.gpuq("run")
    assert gq.wait_state(2, "done")
    ran = json.loads((exp / "eval-ran.json").read_text())
    assert ran == {"argv": ["--note", "two words"], "seed": "3"}


def test_the_same_queue_is_never_imported_twice(gq: Env) -> None:
    original_queue(gq)
    gq.gpuq("status")
    before = spool_listing(gq)
    again = gq.gpuq("import", str(gq.home / "gpuq.db.bak"))
    assert "already imported" in again.stdout and "nothing to do" in again.stdout
    assert spool_listing(gq) == before
    assert "no queue of the original gpuq" in gq.gpuq("import").stdout


def test_a_queue_json_of_the_first_version(gq: Env) -> None:
    exp = gq.work / "exp01"
    exp.mkdir()
    gq.home.mkdir(parents=True)
    state = {
        "next_id": 4,
        "jobs": [
            {"id": 1, "name": "exp01/train", "script": "train.py", "args": ["--tag", "a b"], "python": "python3",
             "cwd": str(exp), "env": {"K": "v"}, "status": "running", "after": None, "retries": 0, "attempt": 1,
             "added_at": "2025-03-01T10:00:00", "started_at": "2025-03-01T10:00:05", "finished_at": None,
             "exit_code": None, "log_file": ""},
            {"id": 3, "name": "exp01/eval", "script": "eval.py", "args": [], "python": "python3", "cwd": str(exp),
             "env": {}, "status": "pending", "after": 1, "retries": 0, "attempt": 0, "added_at": None,
             "started_at": None, "finished_at": None, "exit_code": None, "log_file": ""},
        ],
    }  # fmt: skip
    elsewhere = gq.work / "queue.json"
    elsewhere.write_text(json.dumps(state))
    out = gq.gpuq("import", str(elsewhere)).stdout
    assert "1 interrupted, 1 pending" in out
    assert gq.job(1)["cmd"] == ["python3", "-u", "train.py", "--tag", "a b"] and gq.job(3)["after_any"] == [1]
    assert not elsewhere.exists() and elsewhere.with_name("queue.json.bak").exists()
    assert gq.add(str(gq.script("t.py", ""))) == 4
