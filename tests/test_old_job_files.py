"""Job files written by every earlier gpuq (tests/data/job_formats/, its README says which) still
load, show and run: each format's queued, done and failed job put into a spool as that gpuq left
them, `gpuq show` and `status` read them, a real worker runs the queued one and `gpuq retry` runs
the failed one again. And the original single-file gpuq's queues (tests/data/original/) import,
show and run."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuq.cli.cmd_status import JSON_FIELDS
from gpuq.core import schema
from gpuq.core.job import FIELDS
from gpuq.spool import Spool

DATA = Path(__file__).resolve().parent / "data"
FORMATS = sorted(p for p in (DATA / "job_formats").iterdir() if p.is_dir())


def place(gq: Any, tmp_path: Path, frozen: Path) -> tuple[str, int, str]:
    """The frozen file in the spool, its paths made the test's: (state, id, text as placed)."""
    state, name = frozen.name.split("--")
    text = frozen.read_text()
    for old, new in (("/FROZEN/home", gq.home), ("/FROZEN/work", gq.work), ("/FROZEN", tmp_path)):
        text = text.replace(old, str(new))
    target = gq.home / state / name
    target.write_text(text)
    os.chmod(target, 0o600)
    return state, int(name[:6]), text


def test_the_formats_are_every_earlier_one() -> None:
    """Each frozen format holds a set of fields of its own, and the newest is today's."""
    fields = [tuple(json.loads(next(d.glob("pending--*")).read_text())) for d in FORMATS]
    assert len(FORMATS) >= 10 and len(set(map(frozenset, fields))) == len(fields)
    today = schema.new_job(job_id=1, name="n", cmd=["true"], cwd="/", log="")
    assert list(fields[-1]) == list(today)
    assert all(set(old) < set(today) for old in fields[:-1])


@pytest.mark.parametrize("frozen", FORMATS, ids=[d.name for d in FORMATS])
def test_an_old_job_file_loads_shows_and_runs(gq: Any, tmp_path: Path, frozen: Path) -> None:
    gq.gpuq("status")  # the spool made
    placed = {}
    for path in sorted(frozen.iterdir()):
        state, job_id, text = place(gq, tmp_path, path)
        placed[job_id] = (state, text)
    spool = Spool(gq.home)
    for job_id, (state, text) in placed.items():
        job = spool.jobs.load(spool.jobs.find(job_id, (state,)))
        assert dict(job) == json.loads(text)  # read as written, nothing added
        assert job.gpu_request == 1 and job.notify_urls == [] and job.mem_mib is None  # defaults of later fields
        shown = gq.gpuq("show", str(job_id)).stdout
        assert job.name in shown and state in shown
    rows = {row["id"]: row["state"] for row in gq.status_json()}
    assert rows == {job_id: state for job_id, (state, _text) in placed.items()}
    for row in gq.status_json():  # a field the file lacks is given as its default (gpu_request 1), never null
        assert [key for key in JSON_FIELDS if row[key] is None and FIELDS[key].default is not None] == []
    for state, text in placed.values():  # looking changed nothing
        assert [(gq.home / state / name).read_text() for name in gq.files(state)] == [text]

    gq.gpuq("run")  # a real worker: runs what is queued, then returns
    ran = gq.wait_state(3, "done")
    assert ran["exit_code"] == 0 and ran["history"][-1]["outcome"] == "done"
    gq.gpuq("retry", "2")
    gq.gpuq("run")
    again = gq.wait_state(2, "failed")
    assert again["exit_code"] == 1 and len(again["history"]) == 2
    assert "second" in gq.gpuq("show", "2").stdout


@pytest.mark.parametrize("name", ["queue.json", "gpuq.db"])
def test_the_original_gpuqs_queues_import_show_and_run(gq: Any, tmp_path: Path, name: str) -> None:
    """queue.json of its first version and gpuq.db (SQLite) of its last, as it left them: a job
    done, one failed, one waiting for the done one."""
    old = tmp_path / "old"
    (old / "exp").mkdir(parents=True)
    (old / "exp" / "job.py").write_text("print('ran', flush=True)\n")
    if name == "queue.json":
        (old / name).write_text((DATA / "original" / name).read_text().replace("/FROZEN", str(old)))
    else:
        shutil.copy(DATA / "original" / name, old / name)
        with sqlite3.connect(old / name) as db:  # its paths made the test's, every other value kept
            db.execute("UPDATE jobs SET cwd = replace(cwd, '/FROZEN', ?), log_file = replace(log_file, '/FROZEN', ?)",
                       (str(old), str(old)))  # fmt: skip
        db.close()
    gq.gpuq("import", str(old / name))
    states = {row["id"]: row["state"] for row in gq.status_json()}
    assert states == {1: "done", 2: "pending", 3: "failed"}
    for job_id in states:
        assert gq.gpuq("show", str(job_id)).stdout.strip()
    gq.gpuq("run")  # a real worker
    assert gq.wait_state(2, "done")["exit_code"] == 0 and "ran" in gq.log(2)
