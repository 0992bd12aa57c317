"""cache/finished-journal (spool/cache/journal.py, spool_layout.md "cache/"): whoever moves a job
into a finished state appends its `status -a` row (as data), and the next `status -a` uses it instead of reading the
file, only while the file keeps the signature the row was written with. Real spools, real files,
real workers; the output must be the same, byte for byte, with the journal and without it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Env, fill_up, small_tmpfs, wait_for
from test_status_cache import _many, _varied

from gpuq.core import schema, times
from gpuq.spool import Spool
from gpuq.spool.store import encode

JOURNAL = "finished-journal"


def journal_lines(gq: Env) -> list[str]:
    path = gq.home / "cache" / JOURNAL
    return path.read_text().splitlines() if path.exists() else []


def without_caches(gq: Env) -> str:
    """`status -a` with no cache and no journal: every finished file read."""
    for path in (gq.home / "cache").glob("finished*"):
        path.unlink()
    return gq.gpuq("status", "-a").stdout


def test_a_job_run_by_a_worker_and_a_killed_one_leave_their_rows(gq: Env) -> None:
    _many(gq, 11)  # past the newest ten: `status -a` then shows finished jobs from its cache
    gq.script("ok.py", "print('hello')\n")
    gq.script("long.py", "import time\ntime.sleep(120)\n")
    done = gq.add("ok.py")
    gq.start_worker("--watch")
    gq.wait_state(done, "done")
    long = gq.add("long.py")
    gq.wait_state(long, "running")
    gq.gpuq("kill", str(long))
    gq.wait_state(long, "cancelled")
    # the row is appended once the move is done: a moment after the file shows in cancelled/
    cancelled_row = f"\tcancelled\t{long:06d}-"
    lines = wait_for(lambda: (rows := journal_lines(gq)) and any(cancelled_row in ln for ln in rows) and rows)
    # the row's exit code and signal, first in its end (spool/cache/journal.py), shown `exit=0` and
    # `exit=143 (SIGTERM)`
    assert any(f"\tdone\t{done:06d}-" in line and json.loads(line.split("\t")[9])[:2] == [0, ""] for line in lines)
    ended = [json.loads(line.split("\t")[9])[:2] for line in lines if f"\tcancelled\t{long:06d}-" in line]
    assert ended == [[143, "SIGTERM"]], lines

    folded = gq.gpuq("status", "-a").stdout
    assert not (gq.home / "cache" / JOURNAL).exists()  # folded into the cache
    assert not list((gq.home / "cache").glob(JOURNAL + ".*"))  # and its set-aside copy removed
    assert folded == without_caches(gq)
    assert "exit=143 (SIGTERM)" in folded and "exit=0" in folded


def test_output_is_the_same_with_and_without_the_journal(gq: Env) -> None:
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
    assert len(journal_lines(gq)) == len(jobs) + len(odd)  # one row per job, each made when published
    with_journal = gq.gpuq("status", "-a").stdout
    assert with_journal.count("\n") > len(jobs) + len(odd)
    assert with_journal == without_caches(gq)


def test_a_row_is_used_only_while_its_file_is_unchanged(gq: Env) -> None:
    """The journal's row is shown instead of reading the file (a row made up here shows it), until
    the file is changed by hand: in place (same inode) or by a new file under the same name."""
    spool = _many(gq, 5)
    jobs = _varied(spool, gq.work)
    first, second = (spool.jobs.find(j["id"]) for j in jobs[:2])
    assert first is not None and second is not None
    lines = journal_lines(gq)
    made_up = [_renamed(line, "FROM-THE-JOURNAL") if f"\t{first.name}\t" in line else line for line in lines]
    (gq.home / "cache" / JOURNAL).write_text("\n".join(made_up) + "\n")
    assert "FROM-THE-JOURNAL" in gq.gpuq("status", "-a").stdout  # the row, not the file

    for path in (gq.home / "cache").glob("finished*"):
        path.unlink()
    (gq.home / "cache" / JOURNAL).write_text("\n".join(made_up) + "\n")
    path = Path(spool.layout.job_path(first.state, first.name))
    inode = path.stat().st_ino
    path.write_text(path.read_text().replace(jobs[0]["name"], "edited-in-place"))  # the same inode
    assert path.stat().st_ino == inode
    out = gq.gpuq("status", "-a").stdout
    assert "edited-in-place" in out and "FROM-THE-JOURNAL" not in out
    assert out == without_caches(gq)

    other = Path(spool.layout.job_path(second.state, second.name))
    renamed_row = _renamed(next(x for x in lines if f"\t{second.name}\t" in x), "STALE")
    (gq.home / "cache" / JOURNAL).write_text(renamed_row + "\n")
    for cache in ("finished-view", "finished-index"):
        (gq.home / "cache" / cache).unlink(missing_ok=True)
    replacement = other.with_name(".edit")
    replacement.write_text(other.read_text().replace(jobs[1]["name"], "edited-as-a-new-file"))
    os.replace(replacement, other)  # an editor's way: a new file (new inode) under the old name
    out = gq.gpuq("status", "-a").stdout
    assert "edited-as-a-new-file" in out and "STALE" not in out


def _renamed(line: str, name: str) -> str:
    parts = line.split("\t")
    parts[6] = name
    return "\t".join(parts)


def test_torn_and_foreign_lines_are_skipped(gq: Env) -> None:
    spool = _many(gq, 5)
    _varied(spool, gq.work)
    whole = journal_lines(gq)
    expected = without_caches(gq)
    marked = [_renamed(line, f"J{n}") for n, line in enumerate(whole)]  # rows whose use shows
    torn_inside = marked[1][: len(marked[1]) // 2]  # a line cut short, and the next append after it
    text = "\n".join([marked[0], torn_inside + marked[2], *marked[3:-1]]) + "\n"
    text += "not a row at all\n" + "\t".join(["another-gpuq", *marked[-1].split("\t")[1:]]) + "\n"
    text += marked[-1][:20]  # a torn last line
    (gq.home / "cache" / JOURNAL).write_text(text)
    proc = gq.gpuq("status", "-a")
    assert proc.stderr == ""
    out = proc.stdout
    used = {n for n in range(len(marked)) if f" J{n} " in out}
    assert used == {0, *range(3, len(marked) - 1)}  # the torn, merged and foreign rows left out
    for path in (gq.home / "cache").glob("finished*"):
        path.unlink()
    (gq.home / "cache" / JOURNAL).write_text("\n".join(whole) + "\n" + whole[0][:25])
    assert gq.gpuq("status", "-a").stdout == expected


def test_a_row_appended_while_a_fold_runs_is_kept(gq: Env) -> None:
    """The fold renames the journal aside first: what is appended after goes to a new journal."""
    from gpuq.spool.cache import journal

    spool = Spool(gq.home).ensure()
    _varied(spool, gq.work)
    taken = journal.take(spool.layout)
    assert taken.rows["done"] and not (gq.home / "cache" / JOURNAL).exists()
    job_id = spool.ids.allocate()
    job = schema.new_job(job_id=job_id, name="late", cmd=["python3", "t.py"], cwd=str(gq.work), log="")
    job.update(started_at=times.now_iso(), finished_at=times.now_iso(), exit_code=0, rev=1)
    spool.jobs.publish(job, "done")
    taken.finish()
    assert any(f"\t{job_id:06d}-late.json\t" in line for line in journal_lines(gq))


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "4m") as mount:
        yield mount


def test_an_append_on_a_full_disk_is_skipped_and_the_job_still_ends(gq: Env, tiny_fs: Path) -> None:
    gq.home = tiny_fs / "spool"
    gq.env["GPUQ_HOME"] = str(gq.home)
    spool = Spool(gq.home).ensure()
    job = schema.new_job(job_id=spool.ids.allocate(), name="ends", cmd=["python3", "t.py"], cwd=str(gq.work), log="")
    ref = spool.jobs.publish(job, "running")
    end = {"started_at": times.now_iso(), "finished_at": times.now_iso(), "exit_code": 0}
    size = len(encode(dict(job, **end, rev=job["rev"] + 1)))
    room = spool.files.reserve(size)  # as a supervisor does, but only just the size: truncating frees nothing
    spool.files.give_up_emergency_room()
    fill_up(tiny_fs)  # the disk fills up
    spool.jobs.move(ref, job, "done", end, room)  # written into the room; the journal has none
    assert spool.jobs.find(job["id"], ("done",)) is not None
    assert journal_lines(gq) == []
    (tiny_fs / "filler").unlink()
    out = gq.gpuq("status", "-a").stdout
    assert "ends" in out and "exit=0" in out


def test_fields_that_need_escaping_come_back_as_they_were() -> None:
    from gpuq.spool.cache import journal

    texts = ("tab\there", "back\\slash", "new\nline", "lone \udcff surrogate", "é")
    key = journal.runs.command_key(["python3", texts[0], texts[3]], "/work/" + texts[4])  # JSON: backslashes
    row = (texts[0], texts[1], 61, (-9, texts[2], 812, texts[3], texts[4], "", 5, ""), key, 61.25, '[null, "\\t"]')
    end = journal.jsontext.dumps(list(row[3][:-1]))
    fields = (journal.TAG, "done", "000001-x.json", 5, 6, 7, *row[:3], end, key, "61.25", row[6])
    line = "\t".join(map(journal._field, fields)) + "\n"
    out: dict[str, dict[str, tuple]] = {"done": {}}
    journal._add_rows(out, line.encode())
    assert out["done"] == {"000001-x.json": ((5, 6, 7), row)}


def test_a_big_listing_filters_names_by_the_same_rule(tmp_path: Path) -> None:
    """Past MANY_NAMES entries, names() filters with layout.JOB_NAME_RE instead of is_job_name."""
    from gpuq.spool import store
    from gpuq.spool.layout import JOB_NAME_RE, is_job_name

    odd = ["000001-a.json", "00001-a.json", "000002-a b.json", "000003-.json", "x.json", ".000004-a.json"]
    odd += ["000005-a.jsonx", "000006-é.json", "٠٠٠٠٠٧-a.json", "0000008-a.b_c-d.json"]
    assert [bool(JOB_NAME_RE.match(n)) for n in odd] == [is_job_name(n) for n in odd]
    spool = Spool(tmp_path / "spool").ensure()
    done = Path(spool.layout.state_dir("done"))
    for name in odd:
        (done / name).write_text("{}")
    small = spool.jobs.names("done")
    old = store.MANY_NAMES
    store.MANY_NAMES = 3
    try:
        assert spool.jobs.names("done") == small == sorted(n for n in odd if is_job_name(n))
    finally:
        store.MANY_NAMES = old
