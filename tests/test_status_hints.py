"""What `gpuq status` tells a person beyond the rows (issue 26): whether pending jobs need a worker
or a person, failures among the hidden finished jobs, dropped files that were rejected, held jobs in
line, --after-any said apart from --after, a folded sweep's progress, and which job holds the line
for the GPUs. Each through the real command line."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.core import schema, times
from gpuq.engine.lifecycle import intake
from gpuq.spool import Spool


def _finish(spool: Spool, work: Path, state: str, exit_code: int, name: str) -> int:
    """A finished job, published as a worker leaves one (no process needed to show its row)."""
    job_id = spool.ids.allocate()
    job = schema.new_job(job_id=job_id, name=name, cmd=["python3", "train.py"], cwd=str(work), log="")
    job.update(started_at=times.now_iso(), finished_at=times.now_iso(), exit_code=exit_code, rev=1)
    spool.jobs.publish(job, state)
    return job_id


def _first_line(gq: Env) -> str:
    return gq.gpuq("status").stdout.splitlines()[0]


def _row(gq: Env, job_id: int) -> str:
    """The line of the status table for job `job_id`."""
    lines = gq.gpuq("status").stdout.splitlines()
    return next(line for line in lines if line.split(maxsplit=1)[:1] == [str(job_id)])


def test_without_a_worker_only_jobs_a_worker_could_start_are_counted(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    bad = _finish(spool, gq.work, "failed", 3, "exp/train")
    gq.script("ok.py", "print('ok')\n")
    gq.add("--after", str(bad), "ok.py")
    gq.add("--hold", "ok.py")
    assert _first_line(gq) == "worker: none running — nothing will start: 1 pending job blocked (see why below)"
    gq.add("--begin", "+2h", "ok.py")
    assert _first_line(gq) == "worker: none running — 1 pending job waits for its --begin time, then needs `gpuq run`"
    first = gq.add("ok.py")
    assert _first_line(gq) == (
        "worker: none running — 1 pending job will not start until `gpuq run` or `gpuq run --daemon`"
    )
    gq.add("--after", str(first), "ok.py")  # a worker starts it too, after the first
    assert "— 2 pending jobs will not start until `gpuq run`" in _first_line(gq)


def test_a_stopped_worker_is_said_stopped_and_promises_no_start(gq: Env) -> None:
    """A worker stopped by Ctrl-Z or SIGSTOP is alive (its locks held) but starts nothing: status,
    its JSON and `eta` say so and how to continue it, not "starts ~0s"; continued, it starts the job."""
    worker = gq.start_worker("--watch")
    wait_for(lambda: _first_line(gq).startswith("worker: running"), what="the worker to register")
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _first_line(gq).startswith("worker: stopped"), what="status to see it stopped")
        job = gq.add("true")
        how = f"it starts no job until it is continued: `kill -CONT {worker.pid}` (or `fg` in its terminal)"
        assert _first_line(gq).endswith(f"(gpus: all, watching; stopped: Ctrl-Z or SIGSTOP) — {how}")
        row = next(r for r in gq.status_json() if r["id"] == job)
        assert row["state"] == "pending" and row["starts_in_seconds"] is None
        assert row["eta_method"] == f"unknown: the worker is stopped (Ctrl-Z or SIGSTOP); {how}"
        assert how in gq.gpuq("eta").stdout and "starts ~" not in _row(gq, job)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    gq.wait_state(job, "done")
    assert _first_line(gq).startswith("worker: running") and "stopped" not in _first_line(gq)


def test_the_footer_says_how_many_hidden_finished_jobs_failed(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    for n in range(13):  # the oldest three are hidden, two of them failed
        _finish(spool, gq.work, "failed" if n in (0, 2, 5) else "done", 1 if n in (0, 2, 5) else 0, f"exp/run-{n}")
    old = time.time() - 60
    for state in ("done", "failed"):  # settled: the second look counts from the cached listing
        os.utime(spool.layout.state_dir(state), (old, old))
    for _look in range(2):
        out = gq.gpuq("status").stdout
        assert "(3 older finished jobs hidden, 2 of them failed: `gpuq status -a`)" in out
        assert out.count("exit=1") == 1  # the third failure is among the newest ten
    gq.gpuq("retry", "1")  # back in the queue: no longer a failure, nor finished
    assert "(2 older finished jobs hidden, 1 of them failed: `gpuq status -a`)" in gq.gpuq("status").stdout


def test_a_footer_without_hidden_failures_says_none(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    for n in range(11):
        _finish(spool, gq.work, "done", 0, f"exp/run-{n}")
    assert "(1 older finished job hidden: `gpuq status -a`)" in gq.gpuq("status").stdout


def _drop(gq: Env, name: str, body: str) -> None:
    """A file dropped into pending/ by hand and taken in (rejected) as a worker would."""
    path = gq.home / "pending" / name
    path.write_text(body)
    old = time.time() - 60
    os.utime(path, (old, old))  # written a while ago: complete, so intake decides on it now
    spool = Spool(gq.home)
    outcome = intake.take_in(spool, name, time.time())
    assert outcome.startswith("rejected: "), outcome


def test_rejected_files_show_in_status_until_listed(gq: Env) -> None:
    Spool(gq.home).ensure()
    assert "rejected" not in gq.gpuq("status").stdout
    _drop(gq, "foo.json", json.dumps({"name": "no command"}))
    line = gq.gpuq("status").stdout.splitlines()[-1]
    assert line.startswith("1 dropped file rejected (foo.json: missing 'cmd'") and line.endswith(": `gpuq rejected`")
    listed = gq.gpuq("rejected").stdout
    assert listed.startswith("rejected/foo.json  ") and "missing 'cmd'" in listed
    assert "rejected" not in gq.gpuq("status").stdout  # seen
    _drop(gq, "bar.json", "{not json")
    _drop(gq, "baz.json", json.dumps({"cmd": "x", "colour": "red"}))
    line = gq.gpuq("status").stdout.splitlines()[-1]
    assert line.startswith("2 dropped files rejected (newest: baz.json: ") and "colour" in line
    shown = json.loads(gq.gpuq("rejected", "--json").stdout)
    assert [r["file"] for r in shown] == ["foo.json", "bar.json", "baz.json"]  # oldest first
    assert all(r["reason"] and r["rejected_at"] for r in shown)
    assert "rejected" not in gq.gpuq("status").stdout


def test_held_jobs_stand_in_line_and_after_any_is_said_apart(gq: Env) -> None:
    gq.script("ok.py", "print('ok')\n")
    first = gq.add("ok.py")
    held = gq.add("--hold", "ok.py")
    after = gq.add("--after", str(first), "ok.py")
    after_any = gq.add("--after-any", str(first), "ok.py")
    lines = gq.gpuq("status").stdout.splitlines()[3:]
    assert [int(line.split()[0]) for line in lines] == [first, held, after, after_any]
    assert f"held: `gpuq release {held}`" in lines[1]
    assert lines[2].endswith(f"after #{first}") and lines[3].endswith(f"after-any #{first}")
    rows = {r["id"]: r for r in gq.status_json()}
    assert rows[after]["waiting"] == f"after #{first}" and rows[after_any]["waiting"] == f"after-any #{first}"
    ended = _finish(Spool(gq.home), gq.work, "done", 0, "exp/train")  # met: both kinds say so, still apart
    met, met_any = gq.add("--after", str(ended), "ok.py"), gq.add("--after-any", str(ended), "ok.py")
    assert _row(gq, met).endswith(f"after #{ended} (met)")
    assert _row(gq, met_any).endswith(f"after-any #{ended} (met)")


STEPS = """import os, sys, time
print('Step 30/100 loss=1.0', flush=True)
while not os.path.exists('go'):
    time.sleep(0.02)
"""


def test_a_folded_sweep_shows_its_running_members_progress(gq: Env) -> None:
    gq.script("train.py", STEPS)
    ids = [int(i) for i in gq.gpuq("add", "-q", "--sweep", "seed=0,1,2", "train.py", "--seed", "{seed}").stdout.split()]
    gq.start_worker()
    gq.wait_state(ids[0], "running")

    def sweep_line() -> str:
        out = gq.gpuq("status").stdout
        return next((line for line in out.splitlines() if f"sweep #{ids[0]}" in line and "30%" in line), "")

    line = wait_for(sweep_line, 15, what="the sweep's row to show the running member's progress")
    assert "] 30% ETA " in line and "1 running, 2 waiting" in line
    (gq.work / "go").write_text("")
    for job_id in ids:
        gq.wait_state(job_id, "done")


def test_rows_behind_the_first_in_line_for_a_gpu_say_what_it_needs(gq: Env) -> None:
    """A job waiting for a whole GPU keeps it (the only one), and the smaller job behind it waits
    although it would fit there now, saying what the first in line needs. (Behind a first in line
    that asks for memory and waits only for another program's, a job that leaves it its room
    starts instead: test_placement's backfill tests.)"""
    Gpus(gq, fake_gpus(1, total=81920, foreign={0: (4242, 51200)}))  # 30 GiB free
    gq.script("job.py", "print('never started')\n")
    big = gq.add("--gpus", "1", "job.py")
    small = gq.add("--gpu-mem", "10G", "job.py")
    gq.start_worker("--watch")
    said = f"waiting behind #{big}, first in line for a GPU: it needs a whole GPU"
    wait_for(lambda: said in _row(gq, small), 15, interval=0.1, what="the row behind to name the first")
    assert "waiting for GPU 0: 50.0 GiB held by pid 4242" in _row(gq, big)  # its own reason
    assert gq.state_of(small) == "pending"


def test_without_gpus_a_job_behind_a_running_one_says_it_waits_for_its_slot(gq: Env) -> None:
    """Without GPUs the job behind a running one had an empty Info column, and `show` said `next in
    line for a worker` while the worker was busy with the job ahead."""
    Gpus(gq, {"gpus": []})
    gq.script("wait.py", WAIT_FOR_GO)
    first, second = gq.add("wait.py"), gq.add("wait.py")
    gq.start_worker("--watch")
    said = f"waiting for a free slot (job #{first} running)"
    wait_for(lambda: said in _row(gq, second), 15, interval=0.1, what="the row behind to name the running job")
    assert f"pending: {said}" in gq.gpuq("show", str(second)).stdout
    (gq.work / "go").touch()
    gq.wait_state(second, "done")


def test_with_two_workers_a_waiting_job_names_the_running_jobs_of_both(gq: Env) -> None:
    """Two workers (`--gpus a`, `--gpus b`): a job waiting behind them named only one worker's job."""
    Gpus(gq, {"gpus": []})
    gq.script("wait.py", WAIT_FOR_GO)
    first, second, third = gq.add("wait.py"), gq.add("wait.py"), gq.add("wait.py")
    gq.start_worker("--watch", "--gpus", "a")
    gq.start_worker("--watch", "--gpus", "b")
    gq.wait_state(first, "running")
    gq.wait_state(second, "running")
    said = f"waiting for a free slot (jobs #{first}, #{second} running)"
    wait_for(lambda: said in _row(gq, third), 15, interval=0.1, what="the row behind to name both running jobs")
    (gq.work / "go").touch()
    gq.wait_state(third, "done")


def test_a_sweep_with_several_running_members_shows_each_without_bars() -> None:
    from gpuq.cli import render
    from gpuq.core.job import Job
    from gpuq.engine.tracking.eta import Estimate
    from gpuq.engine.tracking.progress import Reading
    from gpuq.engine.views.status import Row

    def member(job_id: int, state: str, step: float = 0) -> Row:
        sweep = {"id": 1, "values": {"seed": str(job_id)}}
        job = Job(id=job_id, name=f"exp/train seed={job_id}", cmd=["python3", "train.py"], sweep=sweep)
        reading = Reading(step, 100.0, "log", "Step N/M", at=0.0)
        row = Row(job, state)
        row.estimate = Estimate(reading, 60.0 * job_id, "rate") if state == "running" else None
        return row

    (folded,) = render.group_sweeps([member(1, "running", 30), member(2, "running", 55), member(3, "pending")])
    info = folded.cells[3]
    assert info.startswith("#1 30% ETA 1m00s, #2 55% ETA 2m00s  sweep of 3 over seed: 0 done, 2 running, 1 waiting")


def test_stop_ends_a_worker_stopped_with_ctrl_z(gq: Env) -> None:
    """`gpuq stop` continues a stopped worker after its SIGTERM (as a service manager does), so it
    exits instead of "did not stop within 10s" while the SIGTERM waits for a `kill -CONT`."""
    worker = gq.start_worker("--watch")
    wait_for(lambda: _first_line(gq).startswith("worker: running"), what="the worker to register")
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _first_line(gq).startswith("worker: stopped"), what="status to see it stopped")
        stopped = gq.gpuq("stop", check=False)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert worker.wait(timeout=10) is not None
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
