"""`gpuq status -a` reads finished jobs' rows from a cache in the spool (engine/finished_rows.py).
These tests change finished job files the ways gpuq does and check that the cache never shows
a stale row."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from conftest import Env

from gpuq.core import schema, times
from gpuq.spool import Spool


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
    first = gq.gpuq("status", "-a").stdout
    assert (gq.home / "cache" / "finished-rows").is_file()
    assert gq.gpuq("status", "-a").stdout == first  # now from the cache
    assert first.count("exp/run-") == 30 and first.count("exit=3") == 6
    default = gq.gpuq("status").stdout
    assert "(20 older finished job(s) hidden" in default and default.count("exp/run-") == 10


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
    spool = _many(gq, 15)
    first = gq.gpuq("status", "-a").stdout
    spool.cache.write("finished-rows", b"\x00not marshal at all")
    proc = gq.gpuq("status", "-a")
    assert proc.stdout == first and proc.stderr == ""
    spool.cache.write("finished-rows", b"")
    assert gq.gpuq("status", "-a").stdout == first


def test_json_reads_the_files_not_the_cache(gq: Env) -> None:
    _many(gq, 12)
    gq.gpuq("status", "-a")
    rows = gq.status_json()
    assert len(rows) == 12 and all(r["cmd"] == ["python3", "train.py"] for r in rows)


def test_a_big_fill_shared_with_forked_children_gives_the_same_rows(gq: Env) -> None:
    """Past PARALLEL_FROM files to parse, children forked per CPU parse shares of them (issue 15):
    the rows must be those of a fill by one process, invalid files left out all the same."""
    from gpuq.cli import render
    from gpuq.engine import finished_rows

    spool = _many(gq, 40)
    broken = Path(spool.layout.job_path("done", "999999-broken.json"))
    broken.write_text("{not json")
    refs = list(spool.jobs.refs(("done",)))  # 32 valid jobs and the broken file
    assert len(refs) == 33
    alone = finished_rows._summarize_some(spool, refs, "done", render.finished_cells)
    assert finished_rows.PARALLEL_FROM > len(refs)  # a fill of 33 files stays in one process
    old = finished_rows.PARALLEL_FROM
    finished_rows.PARALLEL_FROM = 2
    try:
        shared = finished_rows._summarize_all(spool, refs, "done", render.finished_cells)
    finally:
        finished_rows.PARALLEL_FROM = old
    assert len(alone) == 32 and shared == alone
