"""Crash safety: killed workers, killed jobs and supervisors (the reboot case), reused pids,
half-done transitions, stale locks and tmp files, and clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import Env, wait_for

from gpuq.core import schema, times
from gpuq.spool import Spool


def _worker_up(gq: Env, count: int = 1) -> None:
    wait_for(
        lambda: (
            gq.gpuq("status").stdout.count("pid ") >= count and gq.gpuq("status").stdout.startswith("worker: running")
        ),
        what="worker up",
    )


def test_exit_code_kept_when_worker_is_sigkilled_and_restart_waits(gq: Env) -> None:
    gate = gq.work / "gate"
    gq.script(
        "gated.py", f"import os, sys, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nsys.exit(3)\n"
    )
    gq.script("stamp.py", "import sys, time; open(sys.argv[1], 'w').write(str(time.time()))\n")
    first = gq.add("gated.py")
    second = gq.add("stamp.py", str(gq.work / "second-started"))
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(first).get("pid"), what="job started")
    worker.kill()
    worker.wait()
    job_pid = gq.job(first)["pid"]
    os.kill(job_pid, 0)  # the job survived its worker
    gq.start_worker("--watch")
    _worker_up(gq)
    for _ in range(20):  # the new worker has looked several times; the slot is still taken
        gq.gpuq("status")
    assert gq.state_of(second) == "pending" and gq.state_of(first) == "running"
    gate.touch()
    done = gq.wait_state(first, "failed")
    assert done["exit_code"] == 3 and "exit 3" in gq.log(first)
    gq.wait_state(second, "done")
    finished = times.parse_iso(done["finished_at"])
    assert float((gq.work / "second-started").read_text()) >= finished


def test_job_and_supervisor_killed_is_interrupted_then_recovered(gq: Env) -> None:
    marker = gq.work / "first-run"
    gq.script(
        "train.py",
        f"import os, time\np = {str(marker)!r}\n"
        "if not os.path.exists(p):\n    open(p, 'w').close()\n    time.sleep(120)\nprint('second run ok')\n",
    )
    gq.script("eval.py", "print('eval')\n")
    train = gq.add("train.py")
    evaluation = gq.add("--after", str(train), "eval.py")
    worker = gq.start_worker("--watch")
    wait_for(marker.exists, what="first run started")
    # its supervisor records the job's pid and itself once the job runs, which may be just after
    wait_for(lambda: gq.job(train).get("supervisor") is not None, what="the supervisor recorded")
    job = gq.job(train)
    worker.kill()  # the whole machine goes down: worker, supervisor and job
    worker.wait()
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)
    wait_for(lambda: _gone(job["pid"]) and _gone(job["supervisor"]["pid"]), what="processes gone")
    assert gq.state_of(train) == "running"  # nobody has looked yet
    rows = {r["id"]: r for r in gq.status_json()}  # looking is enough
    assert rows[train]["state"] == "interrupted"
    assert "interrupted" in rows[evaluation]["waiting"]
    assert gq.state_of(train) == "interrupted"
    listing = gq.gpuq("recover")  # stdin is not a terminal: it only says what it would do
    assert f"#{train}" in listing.stdout and "would re-queue 1" in listing.stdout
    assert gq.state_of(train) == "interrupted"
    assert "Re-queued 1 job." in gq.gpuq("recover", "--all").stdout
    gq.gpuq("run", timeout=60)
    final = gq.job(train)
    assert final["state"] == "done" and final["id"] == train
    assert [h["outcome"] for h in final["history"]] == ["interrupted", "done"]
    assert gq.state_of(evaluation) == "done"
    assert "second run ok" in gq.log(train)


def test_job_found_dead_ends_at_its_last_sign_of_life_not_at_the_look(gq: Env) -> None:
    steps = "import time\nfor i in range(1, 31):\n    print(f'Step {i}/30', flush=True)\n    time.sleep(0.5)\n"
    gq.script("steps.py", steps)
    train = gq.add("steps.py")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(train).get("supervisor") is not None, what="the supervisor recorded")
    wait_for(lambda: "Step 2/30" in gq.log(train), what="the job writing its log")
    job = gq.job(train)
    worker.kill()
    worker.wait()
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)
    wait_for(lambda: _gone(job["pid"]) and _gone(job["supervisor"]["pid"]), what="processes gone")
    started = times.parse_iso(job["started_at"])
    last_write = started + 1.0  # made exact: the log's mtime is its last sign of life
    os.utime(Spool(gq.home).layout.log_path(train), (last_write, last_write))
    wait_for(lambda: time.time() > last_write + 4, timeout=30, what="a look well after its death")
    assert {r["id"]: r for r in gq.status_json()}[train]["state"] == "interrupted"
    ended = gq.job(train)
    assert abs(times.parse_iso(ended["finished_at"]) - last_write) < 0.01
    assert ended["history"][-1]["finished_at"] == ended["finished_at"]
    assert "interrupted after 1s" in gq.gpuq("history", str(train)).stdout


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] == "Z"


def _running_job_file(gq: Env, pid: int, create_time: float) -> int:
    """A running/ job as a dead supervisor would have left it, naming process `pid`."""
    spool = Spool(gq.home).ensure()
    job_id = spool.ids.allocate()
    job = schema.new_job(
        job_id=job_id, name="ghost", cmd=["sleep", "1"], cwd=str(gq.work), log=str(spool.layout.log_path(job_id))
    )
    from gpuq.system.procs import boot_id

    job.update(pid=pid, pid_create_time=create_time, boot_id=boot_id(), started_at=times.now_iso(), rev=1)
    spool.jobs.publish(job, "running")
    return job_id


def test_reused_pid_is_not_taken_for_the_job(gq: Env) -> None:
    import psutil

    other = subprocess.Popen(["sleep", "60"])
    try:
        real = psutil.Process(other.pid).create_time()
        alive = _running_job_file(gq, other.pid, real)
        reused = _running_job_file(gq, other.pid, real - 500)  # same pid, another process
        rows = {r["id"]: r for r in gq.status_json()}
        assert rows[alive]["state"] == "running"  # pid and start time match: really alive
        assert rows[reused]["state"] == "interrupted"
        other.kill()
        other.wait()
        rows = {r["id"]: r for r in gq.status_json()}
        assert rows[alive]["state"] == "interrupted"
    finally:
        if other.poll() is None:
            other.kill()
    gq.script("ok.py", "")
    follower = gq.add("ok.py")
    gq.gpuq("run", timeout=60)  # the queue is not blocked by the dead ghosts
    assert gq.state_of(follower) == "done"


def test_other_boot_id_means_the_process_is_gone(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    job_id = _running_job_file(gq, os.getpid(), __import__("psutil").Process().create_time())
    ref = spool.jobs.find(job_id)
    job = spool.jobs.load(ref)
    spool.jobs.rewrite(ref, job, boot_id="another-boot")
    assert {r["id"]: r for r in gq.status_json()}[job_id]["state"] == "interrupted"


def test_recover_says_that_no_worker_will_start_what_it_requeued_only_when_none_runs(gq: Env) -> None:
    """As `add` does: without a worker, the jobs re-queued wait for one, and `recover` says so; while
    a worker runs, it starts them, and `recover` says nothing of it (it said "Run `gpuq run` to
    execute." all the same)."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now, and start time 0 no process ever
    first = _running_job_file(gq, gone.pid, 0.0)
    assert {r["id"]: r for r in gq.status_json()}[first]["state"] == "interrupted"
    alone = gq.gpuq("recover", "--all")
    assert alone.stdout.endswith("Re-queued 1 job.\n") and "gpuq run" not in alone.stdout
    assert (
        alone.stderr
        == f"gpuq recover: no worker is running; #{first} waits for `gpuq run --daemon` (or `gpuq service install`)\n"
    )
    gq.start_worker("--watch")
    _worker_up(gq, count=0)
    gq.wait_state(first, "done", timeout=20)
    second = _running_job_file(gq, gone.pid, 0.0)
    assert {r["id"]: r for r in gq.status_json()}[second]["state"] == "interrupted"
    served = gq.gpuq("recover", "--all")
    assert served.stdout.endswith("Re-queued 1 job.\n") and "gpuq run" not in served.stdout and served.stderr == ""
    gq.wait_state(second, "done", timeout=20)


# ---- half-done transitions ----------------------------------------------------------------------
def _queued(gq: Env, spool: Spool, starts) -> tuple:
    job_id = spool.ids.allocate()
    job = schema.new_job(
        job_id=job_id,
        name="once",
        cmd=["sh", "-c", f"echo $GPUQ_JOB_ID >> {starts}"],
        cwd=str(gq.work),
        log=str(spool.layout.log_path(job_id)),
    )
    return spool.jobs.publish(job), job


def test_job_in_two_states_keeps_the_later_one_and_runs_once(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    starts = gq.work / "starts"
    ref, job = _queued(gq, spool, starts)
    # a crash after writing done/ but before unlinking pending/: rev says which is later
    data = dict(job, rev=job["rev"] + 1, exit_code=0)
    (gq.home / "done" / ref.name).write_text(json.dumps(data))
    os.chmod(gq.home / "done" / ref.name, 0o600)
    ref2, job2 = _queued(gq, spool, starts)
    gq.gpuq("run", timeout=60)
    assert gq.state_of(ref.id) == "done"
    assert starts.read_text().split() == [str(ref2.id)]  # the first one never ran again


def test_orphan_claim_is_broken_and_the_job_runs_once(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    starts = gq.work / "starts"
    ref, _job = _queued(gq, spool, starts)
    code = f"from gpuq.spool import Spool; assert Spool({str(gq.home)!r}).claims.claim({ref.id})"
    subprocess.run([sys.executable, "-c", code], check=True)  # claimed, then died
    assert (gq.home / "locks" / f"{ref.id:06d}.lock").exists()
    assert spool.claims.held(ref.id) is False
    gq.gpuq("run", timeout=60)
    assert starts.read_text().split() == [str(ref.id)]
    assert gq.files("locks") == []


def test_two_breakers_never_hold_a_claim_at_once(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    ref, _job = _queued(gq, spool, gq.work / "unused")
    code = f"from gpuq.spool import Spool; Spool({str(gq.home)!r}).claims.claim({ref.id})"
    subprocess.run([sys.executable, "-c", code], check=True)
    intervals = gq.work / "held"
    code = (
        "import os, sys, time\nfrom gpuq.spool import Spool\n"
        "s = Spool(sys.argv[1]); start = float(sys.argv[3])\n"
        "while time.time() < start: pass\n"
        "for _ in range(20):\n"
        "    c = s.claims.take_over(int(sys.argv[2]))\n"
        "    if c is None: continue\n"
        "    t0 = time.time(); time.sleep(0.005); t1 = time.time()\n"
        f"    fd = os.open({str(intervals)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
        "    os.write(fd, f'{t0} {t1}\\n'.encode()); os.close(fd)\n"
        "    c.release()\n"
    )
    start = str(time.time() + 1.0)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(gq.home), str(ref.id), start]) for _ in range(6)]
    assert all(p.wait(60) == 0 for p in procs)
    held = sorted(tuple(map(float, line.split())) for line in intervals.read_text().splitlines())
    assert len(held) >= 2
    for (_a0, a1), (b0, _b1) in zip(held, held[1:]):
        assert b0 >= a1, "two processes held the same claim at the same time"
    assert gq.files("locks") == []


def test_stale_tmp_and_interrupted_intake_are_resolved(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    dead = subprocess.run(["true"])
    del dead
    stale = gq.home / "tmp" / ".job-999999999-1-abcd"  # no such pid
    stale.write_text("{")
    starts = gq.work / "starts"
    job_id = spool.ids.allocate()
    hidden = gq.home / "pending" / f".intake-{job_id:06d}-dropped.json"
    hidden.write_text(json.dumps({"cmd": ["sh", "-c", f"echo $GPUQ_JOB_ID >> {starts}"]}))
    os.chmod(hidden, 0o600)
    gq.gpuq("run", timeout=60)
    assert not stale.exists()
    assert not hidden.exists()
    assert starts.read_text().split() == [str(job_id)]
    assert gq.state_of(job_id) == "done"


def test_an_interrupted_intake_whose_name_ends_in_a_newline_is_taken_in(gq: Env) -> None:
    """The hidden name is used as listed: a regex's `$` matches before a final newline, so the
    matched text alone named a file that does not exist, and the job never ran."""
    spool = Spool(gq.home).ensure()
    job_id = spool.ids.allocate()
    hidden = gq.home / "pending" / f".intake-{job_id:06d}-x.json\n"
    hidden.write_text(json.dumps({"cmd": ["true"]}))
    gq.gpuq("run", timeout=60)
    assert not hidden.exists()
    assert gq.state_of(job_id) == "done"


# ---- shutdown ------------------------------------------------------------------------------------
def test_ctrl_c_stops_the_worker_at_once_and_leaves_the_job_running(gq: Env) -> None:
    gq.script("slow.py", "import time; time.sleep(60)\n")
    gq.script("ok.py", "")
    job_id = gq.add("slow.py")
    later = gq.add("ok.py")
    worker = gq.start_worker()
    wait_for(lambda: gq.job(job_id).get("pid"), what="job started")
    os.killpg(worker.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground group
    assert worker.wait(10) == 130
    out = gq.worker_output()
    assert "still running" in out and f"#{job_id}" in out and "Traceback" not in out
    assert gq.state_of(job_id) == "running" and gq.state_of(later) == "pending"
    gq.gpuq("kill", str(job_id))


def test_sigterm_stops_a_watch_worker_cleanly(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    _worker_up(gq)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert "worker stopped" in gq.worker_output()
    assert gq.gpuq("status").stdout.startswith("worker: none running")
