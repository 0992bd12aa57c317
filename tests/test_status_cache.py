"""`gpuq status -a` reads finished jobs' rows from the spool's index of finished jobs
(spool/cache/index.py, cache/finished-jobs). These tests change finished job files the ways gpuq
does and check that the index never shows a stale row."""

from __future__ import annotations

import json
import marshal
import os
import time
from pathlib import Path
from typing import Any

from conftest import WAIT_FOR_GO, Env, wait_for

from gpuq.core import schema, times
from gpuq.spool import Spool
from gpuq.spool.cache import index


def _finish(spool: Spool, work: Path, state: str, exit_code: int, name: str) -> dict[str, Any]:
    job_id = spool.ids.allocate()
    job = schema.new_job(job_id=job_id, name=name, cmd=["python3", "train.py"], cwd=str(work), log="")
    job.update(started_at=times.now_iso(), finished_at=times.now_iso(), exit_code=exit_code, rev=1)
    spool.jobs.publish(job, state)
    return job


def _many(gq: Env, count: int) -> Spool:
    spool = Spool(gq.home).ensure()
    for n in range(count):
        _finish(spool, gq.work, "failed" if n % 5 == 0 else "done", 3 if n % 5 == 0 else 0, f"exp/run-{n}")
    return spool


def test_cached_rows_are_the_rows_of_the_files(gq: Env) -> None:
    _many(gq, 30)
    (gq.home / "cache" / "finished-view").write_bytes(b"an older gpuq's cache")
    first = gq.gpuq("status", "-a").stdout
    assert (gq.home / "cache" / index.NAME).is_file()
    assert not (gq.home / "cache" / "finished-view").exists()  # no longer read: not left behind
    assert gq.gpuq("status", "-a").stdout == first  # now from the index
    assert first.count("exp/run-") == 30 and first.count("exit=3") == 6
    default = gq.gpuq("status").stdout
    assert "(20 older finished jobs hidden" in default and default.count("exp/run-") == 10


def test_a_rewritten_finished_file_is_shown_at_once(gq: Env) -> None:
    spool = _many(gq, 20)
    gq.gpuq("status", "-a")
    ref = spool.jobs.find(5, ("done",))
    assert ref is not None
    spool.jobs.rewrite(ref, spool.jobs.load(ref), name="renamed-after-cache", exit_code=0)  # a new file, same name
    assert "renamed-after-cache" in gq.gpuq("status", "-a").stdout


def test_a_trusted_directory_signature_still_sees_later_changes(gq: Env) -> None:
    spool = _many(gq, 20)
    old = time.time() - 60
    for state in ("done", "failed"):
        os.utime(spool.layout.state_dir(state), (old, old))  # settled: the cache trusts the directory
    gq.gpuq("status", "-a")
    gq.gpuq("status", "-a")
    ref = spool.jobs.find(7, ("done",))
    assert ref is not None
    spool.jobs.move(ref, spool.jobs.load(ref), "failed", {"exit_code": 9})
    _finish(spool, gq.work, "done", 0, "added-after-cache")
    out = gq.gpuq("status", "-a").stdout
    assert "added-after-cache" in out and "exit=9" in out
    assert out.count("exp/run-") == 20


def test_a_damaged_cache_is_rebuilt(gq: Env) -> None:
    _many(gq, 15)
    first = gq.gpuq("status", "-a").stdout
    whole = (gq.home / "cache" / index.NAME).read_bytes()
    cut_rows = whole[:-10]  # the head whole, the rows after it cut short: the rows come from the files
    for damage in (b"\x00not marshal at all", b"", marshal.dumps((index.FORMAT, {"done": (1, 2)}, None, [])), cut_rows):
        (gq.home / "cache" / index.NAME).write_bytes(damage)
        proc = gq.gpuq("status", "-a")
        assert proc.stdout == first and proc.stderr == ""


def test_json_reads_the_files_not_the_cache(gq: Env) -> None:
    _many(gq, 12)
    gq.gpuq("status", "-a")
    rows = gq.status_json()
    assert len(rows) == 12 and all(r["cmd"] == ["python3", "train.py"] for r in rows)


def _settle(spool: Spool) -> None:
    """Date the finished directories back: the caches then trust their signatures."""
    old = time.time() - 60
    for state in ("done", "failed", "cancelled"):
        os.utime(spool.layout.state_dir(state), (old, old))


def _cells(row: tuple, state: str) -> tuple[str, ...]:
    """The name, script, time and info cells the CLI makes of a finished row's data."""
    from gpuq.cli import render
    from gpuq.core.times import duration

    return (row[0], row[1], duration(row[2]), render.finished_info(state, *row[3]))


def _varied(spool: Spool, work: Path) -> list[dict[str, Any]]:
    """Finished jobs with every kind of cell a finished row shows."""
    jobs = []
    changes: list[tuple[str, dict[str, Any]]] = [
        ("done", {"exit_code": 0}),
        ("failed", {"exit_code": 3, "reason": "exited with 3", "note": "ran out of memory"}),
        ("failed", {"exit_code": -9, "signal": "SIGKILL", "reason": "time limit of 1m reached", "note": "time limit"}),
        ("cancelled", {"exit_code": None, "note": "cancelled by you", "priority": 5}),
        ("done", {"exit_code": 0, "code_changed": "code changed since it was queued"}),
        ("done", {"exit_code": 0, "slurm": {"job_id": 812, "state": "COMPLETED"}, "started_at": None}),
        ("done", {"exit_code": 0, "sweep": {"id": 1, "values": {"lr": "0.1"}}, "name": "sweep lr=0.1 ünïcode"}),
        ("done", {"exit_code": 0, "shell_env": {"PATH": "/bin", "LANG": "C.UTF-8", "X": "é"}}),
    ]
    for state, change in changes:
        job_id = spool.ids.allocate()
        job = schema.new_job(
            job_id=job_id, name=f"exp/{state}-{job_id}", cmd=["torchrun", "train.py"], cwd=str(work), log=""
        )
        job.update(started_at=times.now_iso(), finished_at=times.now_iso(), rev=1)
        job.update(change)
        spool.jobs.publish(schema.validate(job), state)
        jobs.append(job)
    return jobs


def test_status_a_shows_the_table_of_the_whole_files(gq: Env) -> None:
    """Past RECENT_FINISHED finished jobs, `status -a` prints rows from the index; they
    are the rows the whole files give, in id order, with interrupted ones merged in (held ones
    stand in line with the pending ones, first)."""
    from gpuq.cli import render
    from gpuq.engine.views.status import Row

    spool = _many(gq, 12)
    _varied(spool, gq.work)
    held = schema.new_job(job_id=spool.ids.allocate(), name="held-one", cmd=["true"], cwd=str(gq.work), log="")
    spool.jobs.publish(held, "held")
    _finish(spool, gq.work, "done", 0, "after-held")
    for attempt in range(2):  # the fill, then from the index
        out = gq.gpuq("status", "-a").stdout.splitlines()
        table = out[out.index(next(line for line in out if line.lstrip().startswith("ID"))) :]
        rows = [
            Row(job, ref.state)
            for _id, copies in sorted(spool.jobs.index().items())
            for ref in copies
            for job in [spool.jobs.load(ref)]
        ]
        rows.sort(key=lambda row: row.state not in render.IN_LINE)  # stable: id order within each part
        assert table == render.status_table(rows), attempt


def test_a_damaged_finished_file_is_a_row_saying_so(gq: Env) -> None:
    """A hand-edited file in done/ is shown with why it cannot be read: by `status -a` from the
    index, and by `status` among the newest; never left out silently, never a traceback."""
    spool = _many(gq, 14)
    done = Path(spool.layout.state_dir("done"))
    ref = spool.jobs.find(14, ("done",))
    assert ref is not None
    text = (done / ref.name).read_text()
    (done / ref.name).write_text(text.replace('"exit_code": 0', '"exit_code": "zero"'))
    (done / "000099-mangled.json").write_text('{"schema_version": 1, "id": 99, ')
    os.chmod(done / "000098-open.json", 0o644) if (done / "000098-open.json").exists() else None
    (done / "000098-open.json").write_text(
        text.replace('"id": 14', '"id": 98').replace('"name":', '"name": 1, "name":')
    )
    for args in (("status", "-a"), ("status", "-a"), ("status",)):
        proc = gq.gpuq(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "field 'exit_code' must be null or an integer" in proc.stdout
        assert "000099-mangled.json" in proc.stdout and "not valid JSON" in proc.stdout
        assert "duplicate key 'name'" in proc.stdout
        assert proc.stdout.count("unreadable job file") == 3


def test_a_damaged_running_or_pending_file_is_a_row_saying_so(gq: Env) -> None:
    """The same row as in done/: a damaged file in pending/ (before a worker rejects it) or in
    running/ (its job still runs) used to vanish from `status` without a word."""
    gq.script("wait.py", WAIT_FOR_GO)
    job_ids = gq.add("wait.py"), gq.add("wait.py")

    def damaged_row(job_id: int) -> str:
        path = next(gq.home.glob(f"*/{job_id:06d}-*.json"))
        kept = path.read_bytes()
        path.write_text('{"broken')
        out = gq.gpuq("status").stdout
        path.write_bytes(kept)  # as it was: the worker takes it, its supervisor records the end in it
        row = next((line for line in out.splitlines() if line.split()[:1] == [str(job_id)]), "")
        assert path.name in row and "unreadable job file: not valid JSON" in row, out
        return row

    assert "⏳" in damaged_row(job_ids[1])  # no worker yet: the pending file stays until one looks
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_ids[0]).get("pid"), 15, what="the job started")  # its file written for now
    damaged_row(job_ids[0])
    (gq.work / "go").write_text("")
    for job_id in job_ids:
        gq.wait_state(job_id, "done")


def test_status_json_lists_damaged_files_as_entries_saying_so(gq: Env) -> None:
    """`status --json` left out a damaged job file in every state (the text `status` shows it): a
    script saw no trace of it. Now it is an entry with `damaged` true, its file, state and why, every
    other field of a row null; the jobs' rows keep their fields, with `damaged` false."""
    _many(gq, 14)
    queued, held = gq.add("true"), gq.add("--hold", "true")
    broken = [
        ("pending", "000090-cut.json", '{"schema_version": 1, "id": 90, '),
        ("preempted", "000091-zeroed.json", "\0" * 40),
        ("done", "000092-edited.json", '{"schema_version": 1}'),
    ]
    for state, name, text in broken:
        (gq.home / state / name).write_text(text)
    for args in (("status", "--json"), ("status", "-a", "--json")):
        rows = json.loads(gq.gpuq(*args).stdout)
        jobs = {r["id"]: r for r in rows if not r["damaged"]}
        assert jobs[queued]["state"] == "pending" and jobs[held]["state"] == "held" and jobs[queued]["cmd"] == ["true"]
        # -a: every finished job (read from its file, not the index's rows); else the 10 newest, #92 one of them
        assert len(jobs) == (16 if "-a" in args else 11)
        damaged = {r["id"]: r for r in rows if r["damaged"] is True}
        assert sorted(damaged) == [90, 91, 92], args
        for state, name, _text in broken:
            entry = damaged[int(name[:6])]
            assert set(entry) == set(jobs[queued]) | {"file"}, entry
            assert (entry["state"], entry["file"]) == (state, name) and entry["reason"], entry
            assert entry["name"] is None and entry["cmd"] is None and entry["exit_code"] is None
        assert "not valid JSON" in damaged[90]["reason"], damaged[90]


def test_removed_added_and_rewritten_files_show_at_once_in_settled_directories(gq: Env) -> None:
    """With every finished directory's stamp trusted (old enough), the index still sees a file
    removed, one added and one rewritten."""
    spool = _many(gq, 20)
    _settle(spool)
    for _ in range(2):
        assert gq.gpuq("status", "-a").stdout.count("exp/run-") == 20
        assert "(10 older finished jobs hidden" in gq.gpuq("status").stdout
    ref = spool.jobs.find(3, ("done",))
    assert ref is not None
    spool.jobs.remove(ref)
    ref = spool.jobs.find(20, ("done",))
    assert ref is not None
    spool.jobs.rewrite(ref, spool.jobs.load(ref), exit_code=7)  # same name, a new file
    _finish(spool, gq.work, "done", 0, "added-later")
    out = gq.gpuq("status", "-a").stdout
    assert out.count("exp/run-") == 19 and "exp/run-2 " not in out and "added-later" in out and "exit=7" in out
    _settle(spool)
    plain = gq.gpuq("status").stdout
    assert "(10 older finished jobs hidden" in plain and "added-later" in plain and "exit=7" in plain
    ref = spool.jobs.find(21, ("done",))
    assert ref is not None
    spool.jobs.remove(ref)
    _settle(spool)
    plain = gq.gpuq("status").stdout
    assert "(9 older finished jobs hidden" in plain and "added-later" not in plain
    assert gq.gpuq("status", "-a").stdout.count("exp/run-") == 19


def test_a_fill_right_after_jobs_finished_is_stamped_once_settled(gq: Env) -> None:
    """The first `status -a` often runs while done/ is still being written: its stamp is not
    trusted yet, so the next reader lists it again (reading nothing it holds); once the directory
    settled, the index is stamped and a later file is seen all the same."""
    spool = _many(gq, 15)
    assert spool.finished.read().entries["done"].stamp is None  # just written: not trusted yet
    old = time.time() - 60
    os.utime(spool.layout.state_dir("done"), (old, old))
    assert spool.finished.read().entries["done"].stamp is not None
    written = os.stat(gq.home / "cache" / index.NAME).st_mtime_ns
    assert gq.gpuq("status", "-a").stdout.count("exp/run-") == 15
    assert os.stat(gq.home / "cache" / index.NAME).st_mtime_ns == written  # nothing new: not rewritten
    _finish(spool, gq.work, "done", 0, "one-more")
    assert "one-more" in gq.gpuq("status", "-a").stdout


def test_the_table_of_finished_rows_is_the_table_the_rows_give() -> None:
    """`status -a` prints the finished rows from the index's columns, with running, pending and
    interrupted rows merged in by id: the table of all the rows as rows."""
    from gpuq.cli import render
    from gpuq.engine.views.status import CachedRow

    ends = [(0 if n % 3 else 1, "", None, "", "" if n % 3 else "ünï", "", None, "") for n in range(1, 30)]
    data = [(f"exp/run-{n}", "train.py", n, end, "", None, "") for n, end in enumerate(ends, 1)]
    ids = list(range(10, 39))
    states = ["done" if n % 3 else "failed" for n in range(1, 30)]
    cells = [_cells(row, state) for row, state in zip(data, states)]
    assert cells[2] == ("exp/run-3", "train.py", "3s", "exit=1  ünï")
    finished = [CachedRow(i, s, c) for i, s, c in zip(ids, states, cells)]
    entries = {
        state: index.Entry(None, *zip(*[(i, "", 0, r) for i, s, r in zip(ids, states, data) if s == state]))
        for state in ("done", "failed")
    }
    made = index.FinishedRows({**entries, "cancelled": index.EMPTY})
    assert made.ids == ids and made.states == states

    narrow = CachedRow(40, "running", ("r", "x.py", "1s", ""))
    wide = CachedRow(41, "pending", ("a-much-longer-name-than-any-finished-one", "x.py", "", ""))
    stopped = [CachedRow(5, "interrupted", ("h", "x.py", "", "")), CachedRow(20, "preempted", ("h2", "x.py", "", ""))]
    for rows in ([], [narrow], [narrow, wide], [narrow, *stopped]):
        whole = render.status_table(sorted(rows + finished, key=lambda r: (r.state not in render.IN_LINE, r.job.id)))
        assert render.status_table(rows, now=0.0, finished=made) == whole, rows


def test_status_resolves_a_copy_left_in_another_state_with_the_finished_listing(gq: Env) -> None:
    """A crash mid-move leaves two copies; `status` sees it through the finished listing (from its
    cache too) and keeps the higher rev: a finished copy beside a running one, and two finished
    copies in different states."""
    spool = _many(gq, 12)
    _settle(spool)
    gq.gpuq("status")  # the listing of the finished states is cached now
    for stale_state, kept_state, job_id in (("running", "done", 2), ("done", "failed", 4)):
        ref = spool.jobs.find(job_id, ("done",))
        assert ref is not None
        job = spool.jobs.load(ref)
        stale = dict(job, rev=job["rev"] - 1)
        if kept_state != "done":
            spool.jobs.move(ref, job, kept_state, {"exit_code": 5})
        (Path(spool.layout.state_dir(stale_state)) / ref.name).write_text(json.dumps(stale, indent=2) + "\n")
        (Path(spool.layout.state_dir(stale_state)) / ref.name).chmod(0o644)
        proc = gq.gpuq("status", "-a")
        assert proc.returncode == 0 and proc.stderr == ""
        assert [gq.state_of(job_id)] == [kept_state] and len(list(spool.jobs.index()[job_id])) == 1
        assert proc.stdout.count(f"exp/run-{job_id - 1} ") == 1


def test_status_reads_the_pending_files_as_they_are_now(gq: Env) -> None:
    """A job file changed the way gpuq changes them, or any other, shows as it is now."""
    first, second = gq.add("--name", "first", "true"), gq.add("--name", "second", "true")
    names = lambda: {r["id"]: r["name"] for r in gq.status_json() if not r["damaged"]}  # noqa: E731
    assert names() == {first: "first", second: "second"}
    gq.gpuq("edit", str(second), "--set", "name=renamed")  # a new file in its place
    assert names() == {first: "first", second: "renamed"}
    path = gq.home / "pending" / gq.files("pending")[0]
    path.write_bytes(b"\0" * os.stat(path).st_size)  # broken in place
    assert names() == {second: "renamed"}
    os.chmod(gq.home / "pending" / gq.files("pending")[1], 0o660)  # a read refuses it now
    assert names() == {}
    assert [(r["id"], r["damaged"]) for r in gq.status_json()] == [(first, True), (second, True)]
