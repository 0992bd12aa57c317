"""What the queue's ETA and `gpuq history` need of finished jobs is in their rows of the finished
index (spool/cache/index.py's ROW: key, run and past; spool/cache/runs.py), so neither opens a
finished job's file.

To show that no file is read, the finished files are overwritten in place with garbage (their
inode kept, their directory unchanged): the index still holds their rows, and a read of the file
would find no job at all.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import Env

from gpuq.core import schema
from gpuq.core.states import CANCELLED, DONE, FAILED, FINISHED, INTERRUPTED, PENDING, PREEMPTED, STATES
from gpuq.core.times import iso_of, parse_iso
from gpuq.engine.tracking import eta, queue_eta
from gpuq.engine.views import finished_index, history
from gpuq.spool import Spool
from gpuq.spool.cache import index

T0 = 1714557600.0  # 2024-05-01 10:00 UTC


def garble_in_place(gq: Env, states: tuple[str, ...] = FINISHED) -> int:
    """Every job file of `states` made unreadable, its signature kept; how many."""
    count = 0
    for state in states:
        for name in gq.files(state):
            path = gq.home / state / name
            st = os.stat(path)
            with open(path, "r+b") as fh:
                fh.write(b"\0" * st.st_size)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            count += 1
    return count


def as_the_commands_run(gq: Env, expression: str) -> Any:
    """`expression` (JSON-able) computed by the gpuq the commands run (where gpuq is installed
    beside the checkout, CI's `pip install .`, the installed copy)."""
    code = (
        "import json; from gpuq.spool import Spool; from gpuq.engine.tracking import queue_eta; "
        f"print(json.dumps({expression}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=gq.work, env=gq.env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_times(gq: Env, state: str) -> list[float]:
    """finished - started of each job file of `state`, in id order, as the files say."""
    jobs = [json.loads((gq.home / state / name).read_text()) for name in gq.files(state)]
    return [parse_iso(j["finished_at"]) - parse_iso(j["started_at"]) for j in jobs]


def test_the_queue_eta_reads_run_times_from_the_finished_rows(gq: Env) -> None:
    gq.script("train.py", "import time\ntime.sleep(0.2)\n")
    for _ in range(3):
        gq.add("train.py")
    gq.gpuq("run")  # the queue's jobs, one after the other, then it returns
    assert len(gq.files(DONE)) == 3
    spool = Spool(gq.home)
    key = eta.command_key(spool.jobs.load(next(spool.jobs.refs((DONE,)))))
    expected = run_times(gq, DONE)
    gq.start_worker("--watch")
    blocker = gq.add("sleep", "60")
    gq.wait_state(blocker, "running")
    waiting = gq.add("train.py")  # the same command in the same directory, behind the blocker

    gq.gpuq("eta")  # the rows made, by the code the commands run (see as_the_commands_run)
    assert garble_in_place(gq) == 3
    durations = f"queue_eta.past_durations(Spool({str(gq.home)!r}), {{{key!r}}})"
    assert as_the_commands_run(gq, durations) == {key: expected}  # exactly what the files said
    line = next(line for line in gq.gpuq("eta").stdout.splitlines() if line.startswith(f"#{waiting} "))
    assert "(median of 3 earlier runs)" in line, line


def test_an_index_of_another_format_is_filled_from_the_files_once(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    for n in range(1, 13):
        publish(spool, DONE, [attempt(n, 600 + n, DONE)], cmd=["python3", "train.py"])
    path = gq.home / "cache" / index.NAME
    path.write_bytes(marshal.dumps((index.FORMAT - 1, {DONE: (None, (), (), ())}, None, [])))
    key = eta.command_key(spool.jobs.load(next(spool.jobs.refs((DONE,)))))
    expected = run_times(gq, DONE)[-queue_eta.RUNS :]  # the newest runs
    assert queue_eta.past_durations(spool, {key}) == {key: expected}  # filled from the files
    head = path.read_bytes()[index.HEAD_SIZE_BYTES :]  # after the head's length (marshal reads its first object)
    assert marshal.loads(head)[0] == index.FORMAT  # and written as this gpuq makes it
    garble_in_place(gq)
    assert queue_eta.past_durations(spool, {key}) == {key: expected}  # once: now from the rows


def test_while_jobs_keep_finishing_only_the_new_files_are_read(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    for n in range(1, 7):
        publish(spool, DONE, [attempt(n, 600 + n, DONE)], cmd=["python3", "train.py"])
    spool.finished.read()  # indexed
    key = eta.command_key(spool.jobs.load(next(spool.jobs.refs((DONE,)))))
    before = run_times(gq, DONE)
    garble_in_place(gq)
    publish(spool, DONE, [attempt(20, 42, DONE)], cmd=["python3", "train.py"])  # a job just finished
    assert queue_eta.past_durations(spool, {key}) == {key: (before + [42.0])[-queue_eta.RUNS :]}


def settle(directory: Path, ago: float) -> None:
    """The directory's last change put `ago` seconds back: its stamp is trusted at once."""
    then = time.time() - ago
    os.utime(directory, (then, then))


def test_while_done_is_settled_the_index_is_neither_listed_nor_written(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    for n in range(1, 8):
        publish(spool, DONE, [attempt(n, 600 + n, DONE)], cmd=["python3", "train.py"])
    settle(gq.home / DONE, 100)
    key = eta.command_key(spool.jobs.load(next(spool.jobs.refs((DONE,)))))
    expected = run_times(gq, DONE)[-queue_eta.RUNS :]
    assert queue_eta.past_durations(spool, {key}) == {key: expected}  # from the files, and indexed
    written = os.stat(gq.home / "cache" / index.NAME).st_mtime_ns
    st = os.stat(gq.home / DONE)
    (gq.home / DONE / "000001-stray.json").symlink_to("/nonexistent")  # a listing would see it
    os.utime(gq.home / DONE, ns=(st.st_atime_ns, st.st_mtime_ns))  # the stamp as it was
    assert queue_eta.past_durations(spool, {key, "another command"}) == {key: expected}
    assert os.stat(gq.home / "cache" / index.NAME).st_mtime_ns == written
    publish(spool, DONE, [attempt(20, 42, DONE)], cmd=["python3", "train.py"])  # a job finishes
    settle(gq.home / DONE, 50)
    assert queue_eta.past_durations(spool, {key}) == {key: (expected + [42.0])[-queue_eta.RUNS :]}


def test_history_figures_equal_what_the_job_files_say(gq: Env) -> None:
    gq.script("ok.py", "print('ok')\n")
    gq.add("ok.py")
    gq.gpuq("run")  # one real run
    spool = Spool(gq.home).ensure()
    publish(spool, DONE, [attempt(0, 3600, DONE)], slot="0")
    publish(spool, DONE, [attempt(1, 1800, PENDING, 1), attempt(2, 900, DONE, 2)], gpus=[0, 1])
    publish(spool, FAILED, [attempt(3, 60, FAILED)], gpu_request=0, cmd=["python3", "-m", "pkg.eval"])
    preempted = {"preemptions": [{"at": iso_of(T0 + 4 * 3600 + 100), "by": "user", "exit_code": 143}]}
    publish(spool, DONE, [attempt(4, 100, PREEMPTED, 1), attempt(5, 200, DONE, 2)], **preempted)
    publish(spool, DONE, [attempt(6, 400, DONE)], adopted=True, cwd="/elsewhere")
    publish(spool, CANCELLED, [], started_at=iso_of(T0 + 7 * 3600), finished_at=iso_of(T0 + 7 * 3600 + 5))
    for n in range(8, 12):  # a sweep
        publish(spool, DONE, [attempt(n, 300 + n, DONE)], sweep={"id": 7, "values": {"lr": str(n)}})
    publish(spool, PENDING, [attempt(11, 50, FAILED)])  # failed, waiting for its retry: read from its file
    publish(spool, INTERRUPTED, [attempt(12, 70, INTERRUPTED)])
    # written by hand (no row journalled): the fold reads it; no `history`, times in UTC with a Z
    hand_id = spool.ids.allocate()
    hand = dict(job_file(hand_id, DONE, []), started_at="2024-05-02T10:00:00Z", finished_at="2024-05-02T11:00:00Z")
    (gq.home / DONE / schema.filename(hand_id, "hand")).write_text(json.dumps(hand, indent=2) + "\n")

    from_files = [(ref.state, job) for state in STATES for ref, job in spool.jobs.load_many(state)]
    assert len(from_files) == 14
    for by in history.GROUP_KEYS:
        for since in (None, T0 + 5 * 3600):
            records = finished_index.history_records(spool)
            assert history.summarize(records, since, by) == history.summarize(from_files, since, by), (by, since)
    assert history.runs(finished_index.history_records(spool)) == history.runs(from_files)
    expected = json.dumps(history.to_json(history.summarize(from_files, None, "sweep")), indent=2)

    gq.gpuq("history")  # the rows made, by the code the commands run (see as_the_commands_run)
    assert garble_in_place(gq) == len(from_files) - 2  # the finished ones; the others are still read
    assert gq.gpuq("history", "--by", "sweep", "--json").stdout.strip() == expected


def attempt(hour: float, seconds: float, outcome: str, number: int = 1) -> dict[str, Any]:
    start = T0 + hour * 3600
    code = 0 if outcome == DONE else 1
    return {
        "attempt": number,
        "started_at": iso_of(start),
        "finished_at": iso_of(start + seconds),
        "exit_code": code,
        "outcome": outcome,
    }


def job_file(job_id: int, state: str, attempts: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    cmd = fields.pop("cmd", ["python3", "train.py", "--seed", str(job_id % 3)])
    job = schema.new_job(job_id=job_id, name=f"run-{job_id}", cmd=cmd, cwd=fields.pop("cwd", "/work"), log="")
    last = attempts[-1] if attempts else {}
    job.update(started_at=last.get("started_at"), finished_at=last.get("finished_at"), attempts=len(attempts))
    job.update(history=attempts, exit_code=last.get("exit_code"), **fields)
    return job


def publish(spool: Spool, state: str, attempts: list[dict[str, Any]], **fields: Any) -> int:
    job_id = spool.ids.allocate()
    spool.jobs.publish(job_file(job_id, state, attempts, **fields), state)
    return job_id


def test_a_spool_without_finished_jobs_has_no_durations(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").ensure()
    assert queue_eta.past_durations(spool, {"anything"}) == {}
    assert finished_index.history_records(spool) == []


def test_damaged_key_or_past_texts_read_as_unknown_not_as_an_error() -> None:
    from gpuq.spool.cache import runs

    good = runs.past_text(DONE, job_file(1, DONE, [attempt(0, 60, DONE)]))
    assert runs.read_pasts([good, "[1, tru", '"text"']) == [
        json.loads(good),
        [None, False, [], []],
        [None, False, [], []],
    ]
    key = runs.command_key(["python3", "t.py"], "/w")
    assert runs.read_keys([key, "{", key]) == {key: (["python3", "t.py"], "/w"), "{": ("?", "?")}
