"""cache/finished-jobs (spool/cache/index.py, spool_layout.md "Derived data"): the one index of
finished jobs, derived from the state directories and rebuilt from them at any time. Real spools,
real files, real workers; the output must be the same, byte for byte, with the index and without it."""

from __future__ import annotations

import marshal
import os
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Env, fill_up, small_tmpfs
from test_status_cache import _many, _varied

from gpuq.core import schema, times
from gpuq.spool import Spool
from gpuq.spool.cache import index


def without_index(gq: Env) -> str:
    """`status -a` with no index: every finished file read."""
    (gq.home / "cache" / index.NAME).unlink(missing_ok=True)
    return gq.gpuq("status", "-a").stdout


def test_a_job_run_by_a_worker_and_a_killed_one_show_their_ends(gq: Env) -> None:
    _many(gq, 11)  # past the newest ten: `status -a` then shows finished jobs from the index
    gq.script("ok.py", "print('hello')\n")
    gq.script("long.py", "import time\ntime.sleep(120)\n")
    done = gq.add("ok.py")
    gq.start_worker("--watch")
    gq.wait_state(done, "done")
    gq.gpuq("status", "-a")  # the index holds the done job now
    long = gq.add("long.py")
    gq.wait_state(long, "running")
    gq.gpuq("kill", str(long))
    gq.wait_state(long, "cancelled")
    shown = gq.gpuq("status", "-a").stdout
    assert shown == without_index(gq)
    assert "exit=143 (SIGTERM)" in shown and "exit=0" in shown


def test_moving_a_job_writes_nothing_derived(gq: Env) -> None:
    """The store knows nothing of the index: publishing and moving finished jobs leaves cache/ as
    it was; a reader brings the index up to date."""
    spool = _many(gq, 3)
    assert os.listdir(gq.home / "cache") == []
    gq.gpuq("status", "-a")
    assert os.listdir(gq.home / "cache") == [index.NAME]
    before = (gq.home / "cache" / index.NAME).read_bytes()
    ref = spool.jobs.find(2, ("done",))
    assert ref is not None
    spool.jobs.move(ref, spool.jobs.load(ref), "failed", {"exit_code": 4})
    assert (gq.home / "cache" / index.NAME).read_bytes() == before
    assert "exit=4" in gq.gpuq("status", "-a").stdout


def test_output_is_the_same_with_and_without_the_index(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    jobs = _varied(spool, gq.work)
    odd = [
        ("done", {"name": "tab\there back\\slash", "note": "x"}),
        ("failed", {"name": "é \\t", "exit_code": 2, "reason": "exited with 2", "note": "a\nb"}),
        ("cancelled", {"started_at": None, "finished_at": None, "exit_code": None, "note": "cancelled by you"}),
    ]
    for state, change in odd:
        job_id = spool.ids.allocate()
        job = schema.new_job(job_id=job_id, name="odd", cmd=["python3", "t.py"], cwd=str(gq.work), log="")
        job.update(started_at=times.now_iso(), finished_at=times.now_iso(), exit_code=0, rev=1)
        job.update(change)
        spool.jobs.publish(schema.validate(job), state)
    with_index = gq.gpuq("status", "-a").stdout
    assert with_index.count("\n") > len(jobs) + len(odd)
    assert gq.gpuq("status", "-a").stdout == with_index  # from the index
    assert with_index == without_index(gq)


def _rename_row(gq: Env, state: str, file_name: str, shown: str) -> None:
    """Make the index's row of `file_name` show `shown` as its name, its stamp kept."""
    path = gq.home / "cache" / index.NAME
    data, size = path.read_bytes(), index.HEAD_SIZE_BYTES
    at = size + int.from_bytes(data[:size], "little")  # the file: the head's length, the head, the rows
    all_rows = marshal.loads(data[at:])
    names, rows = marshal.loads(data[size:at])[1][state][2], all_rows[state]
    at_row = names.index(file_name)
    all_rows[state] = rows[:at_row] + ((shown, *rows[at_row][1:]),) + rows[at_row + 1 :]
    path.write_bytes(data[:at] + marshal.dumps(all_rows))


def test_a_row_is_used_while_its_directory_is_unchanged_and_a_new_file_is_read(gq: Env) -> None:
    """While a finished directory keeps its stamp, its rows come from the index (a row changed
    here shows); a file replaced under the same name (a new inode) is read again."""
    spool = _many(gq, 5)
    jobs = _varied(spool, gq.work)
    first = spool.jobs.find(jobs[0]["id"])
    assert first is not None
    old = os.stat(spool.layout.state_dir(first.state)).st_mtime - 60
    os.utime(spool.layout.state_dir(first.state), (old, old))  # settled: the index stamps it
    gq.gpuq("status", "-a")
    _rename_row(gq, first.state, first.name, "FROM-THE-INDEX")
    assert "FROM-THE-INDEX" in gq.gpuq("status", "-a").stdout  # the row, not the file

    path = Path(spool.layout.job_path(first.state, first.name))
    replacement = path.with_name(".edit")
    replacement.write_text(path.read_text().replace(jobs[0]["name"], "edited-as-a-new-file"))
    os.replace(replacement, path)  # an editor's way: a new file (new inode) under the old name
    out = gq.gpuq("status", "-a").stdout
    assert "edited-as-a-new-file" in out and "FROM-THE-INDEX" not in out
    assert out == without_index(gq)


def test_a_removed_file_leaves_the_index(gq: Env) -> None:
    spool = _many(gq, 14)
    gq.gpuq("status", "-a")
    ref = spool.jobs.find(13, ("done",))
    assert ref is not None
    spool.jobs.remove(ref)
    out = gq.gpuq("status", "-a").stdout
    assert "exp/run-12 " not in out and out.count("exp/run-") == 13
    assert 13 not in spool.finished.read().states()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "4m") as mount:
        yield mount


def test_a_full_disk_gets_no_index_and_the_job_still_ends(gq: Env, tiny_fs: Path) -> None:
    gq.home = tiny_fs / "spool"
    gq.env["GPUQ_HOME"] = str(gq.home)
    spool = Spool(gq.home).ensure()
    job = schema.new_job(job_id=spool.ids.allocate(), name="ends", cmd=["python3", "t.py"], cwd=str(gq.work), log="")
    ref = spool.jobs.publish(job, "running")
    end = {"started_at": times.now_iso(), "finished_at": times.now_iso(), "exit_code": 0}
    fill_up(tiny_fs)  # the disk fills up
    spool.jobs.move(ref, job, "done", end)  # written in the room the spool's emergency room gives up
    assert spool.jobs.find(job["id"], ("done",)) is not None
    out = gq.gpuq("status", "-a").stdout
    assert "ends" in out and "exit=0" in out
    assert not (gq.home / "cache" / index.NAME).exists()  # the disk's last room is for job files
    (tiny_fs / "filler").unlink()
    out = gq.gpuq("status", "-a").stdout
    assert "ends" in out and "exit=0" in out and (gq.home / "cache" / index.NAME).exists()
