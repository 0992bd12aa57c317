"""The rows journal of the finished index (spool/cache/journal.py, cache/finished-jobs.journal):
the code that finishes a job appends the job's row once its move has committed, and the index's
next build takes a file's row from it instead of reading the file, only for that name and inode."""

from __future__ import annotations

import json
import marshal
import os
import signal
from pathlib import Path

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_status_cache import _finish, _many, _varied

from gpuq.core import schema, times
from gpuq.core.job import FIELDS, Job
from gpuq.core.states import FINISHED
from gpuq.spool import JobRef, Spool
from gpuq.spool.cache import index, journal
from gpuq.spool.store import encode


def _index_rows(spool: Spool) -> dict[str, index.Entry]:
    """Every finished state's entry of the index as a read now builds or finds it (stamps aside)."""
    return {state: entry._replace(stamp=None) for state, entry in spool.finished.read().entries.items()}


def _from_files(gq: Env, spool: Spool) -> dict[str, index.Entry]:
    """The index built from the files alone: no index, no journal."""
    for name in (index.NAME, journal.NAME):
        (gq.home / "cache" / name).unlink(missing_ok=True)
    return _index_rows(spool)


def _journal(spool: Spool) -> journal.Rows:
    return spool.finished.journal.read()[1]


def _row_of_file(spool: Spool, ref: JobRef) -> tuple[int, tuple]:
    data = spool.jobs.read_bytes(ref.state, ref.name)
    inode = os.stat(spool.layout.job_path(ref.state, ref.name)).st_ino
    return inode, index.file_row(data, ref.state, ref.id, 0.0)[0]


def _settled_in(gq: Env, job_id: int, state: str) -> JobRef:
    """The job's file once it is in `state` alone (looked for by listing: nothing read through the
    index, which would fold the journal)."""
    spool = Spool(gq.home)
    wait_for(lambda: gq.state_of(job_id) == state and spool.jobs.find(job_id, ("running",)) is None, 15)
    ref = spool.jobs.find(job_id, (state,))
    assert ref is not None
    return ref


def test_jobs_ended_by_a_real_worker_leave_their_rows(gq: Env) -> None:
    """A job that succeeds, one that fails and one killed, each ended by its supervisor after the
    worker stopped (a worker's full look would fold the journal), and one cancelled while pending:
    each leaves its file's row under its name and inode, the row a read of the file makes."""
    spool = Spool(gq.home).ensure()
    gq.script("wait.py", WAIT_FOR_GO)
    gq.script("fails.py", WAIT_FOR_GO + "raise SystemExit(3)\n")
    gq.script("long.py", "import time\ntime.sleep(120)\n")
    ok, bad, long = gq.add("wait.py"), gq.add("fails.py"), gq.add("long.py")
    gq.gpuq("hold", str(long))
    gq.start_worker("--watch", "--gpus", "0,1")  # two slots
    for job_id in (ok, bad):
        gq.wait_state(job_id, "running")
    gq.gpuq("stop")
    wait_for(lambda: gq.workers[0].poll() is not None, 15, what="the worker to stop")
    assert gq.files("running") and not (gq.home / "cache" / journal.NAME).exists()
    (gq.work / "go").touch()
    ended = {job_id: _settled_in(gq, job_id, state) for job_id, state in ((ok, "done"), (bad, "failed"))}
    gq.gpuq("cancel", str(long))
    ended[long] = _settled_in(gq, long, "cancelled")
    rows = _journal(spool)
    for ref in ended.values():
        assert rows[(ref.state, ref.name)] == _row_of_file(spool, ref), ref


def test_a_job_settled_by_the_repairs_leaves_its_row(gq: Env) -> None:
    """`gpuq kill` of a job whose supervisor died: the repairs record its end (cancelled) through
    the same engine function, and its row is in the journal."""
    spool = Spool(gq.home).ensure()
    gq.script("long.py", "import time\ntime.sleep(120)\n")
    long = gq.add("long.py")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(long).get("pid") is not None and gq.job(long).get("supervisor") is not None, 15)
    job = gq.job(long)
    worker.kill()
    worker.wait()
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    wait_for(lambda: not _alive(job["supervisor"]["pid"]), 10, what="the supervisor gone")
    assert not (gq.home / "cache" / journal.NAME).exists()
    gq.gpuq("kill", str(long))
    ref = _settled_in(gq, long, "cancelled")
    assert "its supervisor was gone" in gq.job(long)["note"]  # recorded by the repairs
    assert _journal(spool)[("cancelled", ref.name)] == _row_of_file(spool, ref)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_index_from_the_journal_is_the_index_from_the_files(gq: Env) -> None:
    """Rows taken from the journal and rows read from the files: the same index, field for field;
    and the journal is truly what the first build took them from."""
    spool = _many(gq, 40)
    _finish(spool, gq.work, "cancelled", 0, "stopped/early")
    for ref in spool.jobs.refs(FINISHED):
        spool.finished.note(ref)
    assert len(_journal(spool)) == 41
    shown = gq.gpuq("status", "-a").stdout  # the first build: every row from the journal
    from_journal = _index_rows(spool)
    assert from_journal == _from_files(gq, spool)
    assert gq.gpuq("status", "-a").stdout == shown
    assert shown.count("exp/run-") == 40 and "stopped/early" in shown


def test_a_matching_row_is_believed_without_reading_the_file(gq: Env) -> None:
    """The build reads no file whose name and inode a journal row matches: a row that says
    something else than its file (made here by hand) is what `status -a` shows (of the jobs past
    the newest ten: those are read from their files)."""
    spool = _many(gq, 14)
    ref = spool.jobs.find(2, ("done",))
    assert ref is not None
    inode, row = _row_of_file(spool, ref)
    spool.finished.journal.append("done", ref.name, inode, ("from-the-journal", *row[1:]))
    assert "from-the-journal" in gq.gpuq("status", "-a").stdout


def test_a_stale_row_is_not_believed(gq: Env) -> None:
    """A file rewritten after its row (by hand or an older gpuq: a new file, so a new inode) is
    read; a job retried (out of failed/) leaves its old row forgotten, and its new end's row wins."""
    spool = _many(gq, 12)
    for ref in spool.jobs.refs(FINISHED):
        spool.finished.note(ref)
    ref = spool.jobs.find(4, ("done",))
    assert ref is not None
    spool.jobs.rewrite(ref, spool.jobs.load(ref), exit_code=9)  # no row appended for it
    failed = spool.jobs.find(6, ("failed",))
    assert failed is not None
    gq.gpuq("retry", "6")
    assert _journal(spool)[("failed", failed.name)][0] == 0  # forgotten: no inode matches
    spool.jobs.move(*_pending(spool, 6), "failed", {"exit_code": 5})  # back by hand: no row
    shown = gq.gpuq("status", "-a").stdout
    assert "exit=9" in shown and "exit=5" in shown
    assert _index_rows(spool) == _from_files(gq, spool)


@pytest.mark.parametrize("noted", [True, False])
def test_a_file_back_under_its_name_with_the_same_inode_is_not_taken_for_the_old_one(gq: Env, noted: bool) -> None:
    """A retried job that fails again may land in failed/ under its old name with the inode its
    first file freed: the index, which holds the first file's row under that name and inode, takes
    the journal's later lines (the retry's forget, then the new end's row, or no row) over it. The
    inode is not reused here on demand: the file is written over in place, which keeps it."""
    spool = _many(gq, 12)
    ref = spool.jobs.find(6, ("failed",))
    assert ref is not None
    assert "exit=3" in gq.gpuq("status", "-a").stdout  # the index holds the row of exit 3
    path = spool.layout.job_path(ref.state, ref.name)
    inode = os.stat(path).st_ino
    with open(path, "r+b") as out:  # its second end: same name, same inode
        out.write(encode(dict(spool.jobs.load(ref), exit_code=5, attempts=2)))
        out.truncate()
    assert os.stat(path).st_ino == inode
    spool.finished.forget(ref)  # as the retry wrote it
    if noted:
        spool.finished.note(ref)  # as the second end wrote it
    _finish(spool, gq.work, "failed", 7, "exp/later")  # failed/ changed since the index was written
    shown = gq.gpuq("status", "-a").stdout
    assert "exit=5" in shown and "exit=3" not in shown.split("exp/run-5", 1)[1].split("\n", 1)[0], shown
    assert _index_rows(spool) == _from_files(gq, spool)


def _pending(spool: Spool, job_id: int) -> tuple[JobRef, Job]:
    ref = spool.jobs.find(job_id, ("pending",))
    assert ref is not None
    return ref, spool.jobs.load(ref)


def test_a_torn_or_damaged_line_is_not_believed(gq: Env) -> None:
    """A last line cut short is skipped, and the next append starts a line of its own; a damaged
    line is skipped; either way the file is read."""
    spool = _many(gq, 4)
    path = gq.home / "cache" / journal.NAME
    refs = list(spool.jobs.refs(("done",)))
    spool.finished.note(refs[0])
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # torn: no line break
    assert _journal(spool) == {}
    spool.finished.note(refs[1])
    assert list(_journal(spool)) == [("done", refs[1].name)]
    inode, row = _row_of_file(spool, refs[2])
    damaged = b"\t".join([str(index.FORMAT).encode(), b"done", refs[2].name.encode(), str(inode).encode()])
    with open(path, "ab") as out:
        out.write(damaged + b"\t" + marshal.dumps(("lie",)).hex().encode() + b"\n")
    assert ("done", refs[2].name) not in _journal(spool)
    assert "lie" not in gq.gpuq("status", "-a").stdout
    assert _index_rows(spool) == _from_files(gq, spool)


def test_no_journal_still_gives_the_whole_answer(gq: Env) -> None:
    """Files dropped by hand or left by an older gpuq: no journal, every file read, same table."""
    spool = _many(gq, 15)
    assert not (gq.home / "cache" / journal.NAME).exists()
    shown = gq.gpuq("status", "-a").stdout
    assert shown.count("exp/run-") == 15
    for ref in spool.jobs.refs(FINISHED):
        spool.finished.note(ref)
    (gq.home / "cache" / index.NAME).unlink()
    assert gq.gpuq("status", "-a").stdout == shown


def test_the_journal_is_folded_when_the_index_is_written(gq: Env) -> None:
    """Once the index is written the journal is empty again: it holds only what finished since."""
    spool = _many(gq, 10)
    path = Path(spool.finished.journal.path)
    for round_ in range(3):
        for n in range(5):
            _finish(spool, gq.work, "done", 0, f"more/{round_}-{n}")
        for ref in spool.jobs.refs(("done",)):
            spool.finished.note(ref)
        assert len(_journal(spool)) >= 5
        assert f"more/{round_}-4" in gq.gpuq("status", "-a").stdout
        assert path.stat().st_size == 0
    assert _index_rows(spool) == _from_files(gq, spool)


def test_a_row_depends_on_no_field_but_those_it_checks(gq: Env) -> None:
    """The build checks only index.READS of a file (schema.validate_fields): any other field,
    however damaged, leaves the row as it was; so a row never rests on a field left unchecked."""
    spool = Spool(gq.home).ensure()
    for job in _varied(spool, gq.work):
        job.update(adopted=True, attempts=2, preemptions=[{"at": times.now_iso()}], gpus=[0], slot="0")
        job["history"] = [{"attempt": 1, "started_at": job.started_at, "finished_at": job.finished_at}]
        data = encode(schema.validate(job))
        row = index.file_row(data, "done", job.id, 0.0)[0]
        for name in sorted(set(FIELDS) - set(index.READS) - {"schema_version", "id"}):
            damaged = json.loads(data)
            damaged[name] = [{"not": "a valid value"}, None]
            assert index.file_row(json.dumps(damaged).encode(), "done", job.id, 0.0)[0] == row, name
