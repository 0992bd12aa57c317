"""Importing the original gpuq's queue into the spool (issue 12): a WAL database and a queue.json
written exactly as the original writes them, imported on first use and with `gpuq import`, never
twice, losing nothing; imported pending jobs then run under a real worker."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import Env
from test_legacy import ORIGINAL_TABLE, WRITER, row

from gpuq.core.job import MAX_ID

DATA = Path(__file__).parent / "data" / "original"

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
    again = gq.gpuq("import").stdout  # nothing left to import: what was imported, said again
    assert "already imported on" in again and "1 cancelled, 1 done, 1 failed, 1 interrupted, 1 pending" in again


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


def _row(job_id: int, cwd: Path, **fields: Any) -> dict[str, Any]:
    """A job of the original's queue.json, pending unless `fields` say otherwise."""
    return {"id": job_id, "name": f"job{job_id}", "script": "train.py", "args": [], "python": "python3",
            "cwd": str(cwd), "env": {}, "status": "pending", "after_job": None, **fields}  # fmt: skip


@pytest.mark.parametrize("next_id, row_id", [(MAX_ID + 1, None), (None, MAX_ID * 10)])
def test_an_id_no_job_may_have_moves_no_counter(gq: Env, next_id: Optional[int], row_id: Optional[int]) -> None:
    """Before: the counter went past MAX_ID, and every later `gpuq add` was refused."""
    exp = gq.work / "exp"
    exp.mkdir()
    path = gq.work / "q.json"
    path.write_text(json.dumps({"next_id": next_id, "jobs": [_row(row_id, exp)] if row_id else []}))
    out = gq.gpuq("import", str(path)).stdout
    if row_id:
        assert f"not imported: row ?: id {row_id} is above {MAX_ID}, the largest a job may have" in out
    else:
        assert f"note: its next id {next_id} is above {MAX_ID}, the largest a job may have; ignored" in out
    assert gq.add("--", "true") == 1


def test_the_counter_refuses_an_id_no_job_may_have(gq: Env) -> None:
    """An id above MAX_ID is never given out, neither to `add` nor to a dropped file (a spool whose
    counter an earlier import moved past it)."""
    gq.gpuq("status")
    for name in ("next_id", "ids.lock"):
        (gq.home / name).write_text(f"{MAX_ID}\n")
    assert gq.add("--", "true") == MAX_ID
    said = f"gpuq: no job id left: ids end at {MAX_ID} and this spool's counter is at {MAX_ID + 1}\n"
    for dry_run in ([], ["--dry-run"]):
        proc = gq.gpuq("add", *dry_run, "--", "true", check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", said), dry_run
    assert (gq.home / "next_id").read_text() == f"{MAX_ID + 1}\n" and len(gq.files("pending")) == 1
    (gq.home / "pending" / "dropped.json").write_text(json.dumps({"cmd": ["true"]}))
    gq.gpuq("run", timeout=30)
    assert gq.state_of(MAX_ID) == "done" and gq.files("pending") == []
    assert said.split(": ", 1)[1].strip() in gq.gpuq("rejected").stdout


def test_a_running_job_of_a_queue_json_whose_process_lives_is_adopted(gq: Env) -> None:
    """Before: 'was running, but no process id was recorded; taken as interrupted', pid and all."""
    exp = gq.work / "exp"
    exp.mkdir()
    started = datetime.now().astimezone().isoformat()  # the original takes the time, then starts the job
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        path = gq.work / "queue.json"
        path.write_text(json.dumps({"jobs": [_row(1, exp, status="running", pid=live.pid, started_at=started)]}))
        out = gq.gpuq("import", str(path)).stdout
        assert "1 running" in out and "no process id" not in out
        job = gq.job(1)
        assert (job["state"], job["pid"], job["adopted"]) == ("running", live.pid, True)
        live.kill()
        live.wait()
        gq.gpuq("status")  # the adopted job ends when a look finds its process gone
        assert gq.state_of(1) != "running"
    finally:
        live.kill()
        live.wait()


def test_an_imported_loop_is_said_and_blocked(gq: Env) -> None:
    """Jobs that waited for each other in the original: imported as they are, each saying so, and
    `gpuq run` exits once the others ran (before: it waited for them for ever)."""
    exp = gq.work / "exp"
    exp.mkdir()
    (exp / "train.py").write_text("")
    path = gq.work / "queue.json"
    jobs = [_row(1, exp, after_job=2), _row(2, exp, after_job=1), _row(3, exp, python=sys.executable)]
    path.write_text(json.dumps({"next_id": 4, "jobs": jobs}))
    out = gq.gpuq("import", str(path)).stdout
    assert "3 pending" in out
    for job_id, other in ((1, 2), (2, 1)):
        loop = f"waits for itself (#{job_id} after #{other} after #{job_id})"
        assert f"note: #{job_id}: {loop}, so it will not start: `gpuq edit` or `gpuq cancel` it" in out
    gq.gpuq("run", timeout=30)
    assert [gq.state_of(i) for i in (1, 2, 3)] == ["pending", "pending", "done"]


@pytest.mark.parametrize("field, value", [("args", 5), ("args", True), ("env", 3.5), ("env", "0")])
def test_a_row_whose_words_are_a_number_is_reported_not_a_traceback(gq: Env, field: str, value: Any) -> None:
    """A number where the original kept a list (args) or an object (env) is one row not imported,
    as any other unreadable row is: the rest of the queue comes in (it once raised TypeError)."""
    exp = gq.work / "exp"
    exp.mkdir()
    path = gq.work / "q.json"
    path.write_text(json.dumps({"next_id": 3, "jobs": [_row(1, exp), _row(2, exp, **{field: value})]}))
    out = gq.gpuq("import", str(path)).stdout
    kind = "a list of words" if field == "args" else "an object of strings"
    assert f"not imported: row 2: {field} is not {kind}" in out
    assert gq.job(1)["name"] == "job1"


def test_completion_leaves_the_import_to_a_command_that_says_it(gq: Env) -> None:
    """`gpuq _ids 2>/dev/null` (every TAB) imported the queue and its report was lost: afterwards
    `gpuq import` said 'no queue of the original gpuq'. Now `_ids` leaves it, and `gpuq import` says
    again what an earlier import did not bring over."""
    exp = gq.work / "exp"
    exp.mkdir()
    gq.home.mkdir(parents=True)
    rows = [_row(1, exp, script=""), _row(2, exp, status="running"), _row(3, exp, args="not-json")]
    (gq.home / "queue.json").write_text(json.dumps({"next_id": 4, "jobs": rows}))
    ids = gq.gpuq("_ids")
    assert ids.stdout == "" and ids.stderr == "" and (gq.home / "queue.json").exists()
    first = gq.gpuq("import").stdout
    assert "imported the original gpuq's queue" in first and "not imported: row 1: no script" in first
    for said in (gq.gpuq("import").stdout, gq.gpuq("import").stdout):
        assert "already imported on" in said and ": 1 interrupted; nothing to do" in said
        assert "not imported: row 1: no script" in said and "not imported: row 3: args is not valid JSON" in said
        assert "note: #2: was running, but no process id was recorded; taken as interrupted" in said


def test_a_queue_json_beside_the_imported_database_is_its_older_form(gq: Env) -> None:
    """Both files in the spool: gpuq.db was imported, then every command refused queue.json's ids
    on stderr. Now queue.json is said once to be the older form and renamed, never imported."""
    gq.home.mkdir(parents=True)
    for name in ("gpuq.db", "queue.json"):
        shutil.copy(DATA / name, gq.home / name)
    first = gq.gpuq("status").stderr
    assert "imported the original gpuq's queue" in first and "gpuq.db: 1 done, 1 failed, 1 pending" in first
    assert "queue.json: not imported: the same queue's older form" in first
    assert "renamed queue.json -> queue.json.bak" in first and "cannot import" not in first
    assert not (gq.home / "queue.json").exists() and (gq.home / "queue.json.bak").exists()
    assert gq.gpuq("status").stderr == ""
    assert gq.state_of(3) == "failed" and gq.job(3)["name"] == "exp/flaky"  # gpuq.db's, not queue.json's


def test_an_imported_jobs_old_log_stays_before_its_retry(gq: Env) -> None:
    """The docs promise the old log stays readable with `gpuq log ID`: after `gpuq retry` it showed
    the new attempt only. Now the original's log comes first in the job's log, as every attempt does."""
    exp = gq.work / "exp"
    exp.mkdir()
    (exp / "train.py").write_text('print("new run")\nraise SystemExit(1)\n')
    old_log = gq.work / "job_001_train.log"
    old_log.write_text("CUDA out of memory (the old run)")
    row = _row(1, exp, python=sys.executable, status="failed", exit_code=1, log_file=str(old_log),
               started_at="2025-03-01T10:00:00", finished_at="2025-03-01T10:01:00")  # fmt: skip
    path = gq.work / "queue.json"
    path.write_text(json.dumps({"next_id": 2, "jobs": [row]}))
    gq.gpuq("import", str(path))
    assert "CUDA out of memory" in gq.gpuq("log", "1").stdout
    gq.gpuq("retry", "1")
    gq.gpuq("run", timeout=30)
    assert gq.state_of(1) == "failed"
    shown = gq.gpuq("log", "1").stdout
    assert "CUDA out of memory (the old run)\n" in shown and "new run" in shown
    assert shown.index("CUDA out of memory") < shown.index("=== gpuq: job #1") < shown.index("new run")
    gq.gpuq("retry", "1")
    gq.gpuq("run", timeout=30)
    assert gq.gpuq("log", "1").stdout.count("CUDA out of memory") == 1  # copied once, at its first start here


def test_an_imported_row_without_an_attempt_is_attempt_1(gq: Env) -> None:
    """A finished row of the original with no `attempt` field was imported as attempt 0: `history
    --json ID` gave `job_attempt: 0` and `show` said `attempts 0 of at most 3` and `1 run in all,
    counting earlier ones`. It ran once: attempt 1, in text and JSON alike."""
    exp = gq.work / "exp"
    exp.mkdir()
    row = _row(1, exp, status="failed", exit_code=3, retries=2,
               started_at="2025-03-01T10:00:00", finished_at="2025-03-01T10:01:00")  # fmt: skip
    path = gq.work / "queue.json"
    path.write_text(json.dumps({"next_id": 2, "jobs": [row, _row(2, exp)]}))  # and a pending one, never started
    gq.gpuq("import", str(path))
    assert (gq.job(2)["attempts"], gq.job(2)["history"]) == (0, [])
    assert gq.job(1)["attempts"] == 1 and [entry["attempt"] for entry in gq.job(1)["history"]] == [1]
    attempts = json.loads(gq.gpuq("history", "1", "--json").stdout)["attempts"]
    assert [(a["attempt"], a["job_attempt"]) for a in attempts] == [(1, 1)]
    shown = gq.gpuq("show", "1").stdout
    assert "attempts   1 of at most 3 (--retries 2)" in shown and "counting earlier ones" not in shown
    assert "  attempt 1  failed (exit 3) after 1m00s" in gq.gpuq("history", "1").stdout


def test_commands_started_together_import_the_queue_once(gq: Env) -> None:
    """Commands run at once on first use each imported the queue: the jobs one published were 'not
    imported: File exists' in another's report, and the record kept such a report (or 'finishing an
    import a crash cut short'). Now one imports, the others wait for it and find nothing left. Three
    spools: the commands start together often, not always."""
    for n in range(3):
        home = gq.home / f"spool{n}"
        home.mkdir(parents=True)
        shutil.copy(DATA / "queue.json", home)
        env = dict(gq.env, GPUQ_HOME=str(home))
        command = [sys.executable, "-m", "gpuq", "status"]
        started = [
            subprocess.Popen(command, env=env, cwd=gq.work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(4)
        ]
        said = [line for proc in started for line in proc.communicate(timeout=60)[1].decode().splitlines()]
        assert [line for line in said if "queue.json" in line] == [
            f"gpuq: imported the original gpuq's queue {home / 'queue.json'}: 1 done, 1 failed, 1 pending",
            "gpuq:   renamed queue.json -> queue.json.bak",
        ], said
        again = gq.gpuq("import", env=env).stdout
        assert "1 done, 1 failed, 1 pending; nothing to do" in again and "not imported" not in again
