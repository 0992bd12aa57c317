"""The worker: order, exit codes, logs, dependencies, retries, watch, daemon, exclusivity, --gpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import WAIT_FOR_GO, Env, wait_for

STAMP = "import sys, time; open(sys.argv[1], 'a').write(f'{sys.argv[2]} {time.time()}\\n')\n"

# `gpuq run` whose periodic look (every RESCAN_SECONDS in case an event was lost) is ten minutes
# away, lengthened in its own process: what it does within a test's minute was set off by a file
# event or by its own short waits, never by that look, however slow a loaded machine makes it.
LOOKS_RARELY = (
    "import sys\n"
    "from gpuq.run import loop\n"
    "loop.RESCAN_SECONDS = 600.0\n"
    "from gpuq.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def start_rare_looker(gq: Env, *args: str) -> subprocess.Popen:
    """`gpuq run ARGS` of LOOKS_RARELY in the background, stopped with the test's other workers."""
    out = open(gq.work / f"worker-{len(gq.workers)}.out", "wb")
    command = [sys.executable, "-c", LOOKS_RARELY, "run", *args]
    proc = subprocess.Popen(
        command, cwd=gq.work, env=gq.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    gq.workers.append(proc)
    return proc


def test_jobs_run_one_after_another_with_exit_codes_and_logs(gq: Env) -> None:
    gq.script("stamp.py", STAMP + "import time; time.sleep(0.3)\n")
    gq.script("fail.py", "import sys; print('about to fail'); sys.exit(3)\n")
    stamps = gq.work / "stamps"
    a = gq.add("stamp.py", str(stamps), "a")
    b = gq.add("fail.py")
    c = gq.add("stamp.py", str(stamps), "c")
    proc = gq.gpuq("run", timeout=60)
    assert "queue empty" in proc.stdout
    assert gq.state_of(a) == "done" and gq.state_of(c) == "done"
    failed = gq.job(b)
    assert failed["state"] == "failed" and failed["exit_code"] == 3
    log = gq.log(b)
    assert "cmd:" in log and "cwd:" in log and "started:" in log
    assert "about to fail" in log and "exit 3" in log
    times = [float(line.split()[1]) for line in stamps.read_text().splitlines()]
    assert times == sorted(times) and times[1] - times[0] >= 0.3  # c started after a had finished


def test_dependency_failure_blocks_dependents_and_after_any_runs(gq: Env) -> None:
    gq.script("fail.py", "raise SystemExit(1)\n")
    gq.script("ok.py", "print('ran')\n")
    bad = gq.add("fail.py")
    dependent = gq.add("--after", str(bad), "ok.py")
    grand = gq.add("--after", str(dependent), "ok.py")
    cleanup = gq.add("--after-any", str(bad), "ok.py")
    proc = gq.gpuq("run", timeout=60)  # must exit, not hang on the blocked jobs
    assert gq.state_of(bad) == "failed"
    assert gq.state_of(cleanup) == "done"
    assert gq.state_of(dependent) == "pending" and gq.state_of(grand) == "pending"
    assert f"#{dependent}" in proc.stdout and "failed" in proc.stdout
    rows = {r["id"]: r for r in gq.status_json()}
    assert "failed" in rows[dependent]["waiting"] and "will not start" in rows[dependent]["waiting"]
    assert rows[grand]["waiting"].startswith(f"after #{dependent}")
    table = gq.gpuq("status").stdout
    assert "blocked" in table and f"gpuq retry {bad}" in table
    assert gq.log(dependent) == ""


def test_dependency_success_chain(gq: Env) -> None:
    gq.script("ok.py", STAMP)
    stamps = gq.work / "s"
    first = gq.add("ok.py", str(stamps), "first")
    second = gq.add("--after", str(first), "ok.py", str(stamps), "second")
    gq.gpuq("run", timeout=60)
    assert gq.state_of(second) == "done"
    assert [line.split()[0] for line in stamps.read_text().splitlines()] == ["first", "second"]


def test_retries_run_again_until_success(gq: Env) -> None:
    counter = gq.work / "count"
    gq.script(
        "flaky.py",
        f"import pathlib, sys\np = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\nsys.exit(0 if n >= 3 else 7)\n",
    )
    job_id = gq.add("--retries", "2", "flaky.py")
    gq.gpuq("run", timeout=60)
    job = gq.job(job_id)
    assert job["state"] == "done" and job["attempts"] == 3
    assert [h["exit_code"] for h in job["history"]] == [7, 7, 0]


def test_retries_exhausted_ends_failed(gq: Env) -> None:
    gq.script("bad.py", "raise SystemExit(5)\n")
    job_id = gq.add("--retries", "1", "bad.py")
    gq.gpuq("run", timeout=60)
    job = gq.job(job_id)
    assert job["state"] == "failed" and job["attempts"] == 2 and job["exit_code"] == 5


def test_job_that_cannot_start_fails_with_reason_in_log(gq: Env) -> None:
    (gq.home / "pending").mkdir(parents=True)
    (gq.home / "pending" / "broken.json").write_text(json.dumps({"cmd": ["/no/such/interpreter", "x"]}))
    gq.gpuq("run", timeout=60)
    [name] = gq.files("failed")
    job = json.loads((gq.home / "failed" / name).read_text())
    assert job["exit_code"] == 127 and "could not start" in job["note"]
    assert "could not start" in gq.log(job["id"]) and "/no/such/interpreter" in gq.log(job["id"])


def test_watch_worker_starts_new_jobs_without_a_polling_delay(gq: Env) -> None:
    gq.script("stamp.py", STAMP)
    start_rare_looker(gq, "--watch")
    wait_for(lambda: gq.gpuq("status").stdout.startswith("worker: running"), what="worker up")
    stamps = gq.work / "stamps"
    for n in range(3):
        gq.add("stamp.py", str(stamps), str(n))
        # Its periodic look is ten minutes away: a start within the minute is the file event's.
        wait_for(
            lambda n=n: stamps.exists() and len(stamps.read_text().splitlines()) > n,
            timeout=60,
            what=f"job {n} to start",
        )


def test_daemon_returns_at_once_and_stop_leaves_jobs_running(gq: Env) -> None:
    gq.script("slow.py", "import time; time.sleep(60)\n")
    # capture_output: if the daemon kept our stdout open, this call would not return
    proc = gq.gpuq("run", "--daemon", timeout=30)
    assert "worker started in the background: pid" in proc.stdout and "worker.log" in proc.stdout
    job_id = gq.add("slow.py")
    job = gq.wait_state(job_id, "running")
    wait_for(lambda: gq.job(job_id).get("pid"), what="job pid")
    out = gq.gpuq("stop").stdout
    assert "stopped worker" in out and "keep running" in out and f"#{job_id}" in out
    assert gq.gpuq("status").stdout.startswith("worker: none running")
    assert gq.state_of(job_id) == "running"
    os.kill(gq.job(job_id)["pid"], 0)  # still alive
    gq.gpuq("kill", str(job_id))
    assert gq.state_of(job_id) == "cancelled"
    del job


def test_second_worker_is_refused_naming_the_first(gq: Env) -> None:
    first = gq.start_worker("--watch")
    wait_for(lambda: gq.gpuq("status").stdout.startswith("worker: running"), what="worker up")
    proc = gq.gpuq("run", check=False)
    assert proc.returncode == 1
    assert f"pid {first.pid}" in proc.stderr and "Traceback" not in proc.stderr
    proc = gq.gpuq("run", "--gpus", "0", check=False)
    assert proc.returncode == 1 and f"pid {first.pid}" in proc.stderr


def test_gpu_workers_share_a_spool_without_running_a_job_twice(gq: Env) -> None:
    log = gq.work / "starts"
    gq.script(
        "job.py",
        "import os, sys, time\n"
        f"fd = os.open({str(log)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
        "os.write(fd, f\"{sys.argv[1]} {os.environ['CUDA_VISIBLE_DEVICES']}\\n\".encode())\n"
        "time.sleep(0.1)\n",
    )
    ids = [gq.add("job.py", str(n)) for n in range(16)]
    w0 = gq.start_worker("--gpus", "0")
    w1 = gq.start_worker("--gpus", "1")
    assert w0.wait(120) == 0 and w1.wait(120) == 0
    lines = log.read_text().split()
    starts, gpus = lines[0::2], lines[1::2]
    assert sorted(map(int, starts)) == list(range(16))
    assert set(gpus) == {"0", "1"}
    assert all(gq.state_of(i) == "done" for i in ids)
    assert gq.files("locks") == []


def test_overlapping_gpu_sets_are_refused(gq: Env) -> None:
    gq.start_worker("--watch", "--gpus", "0,1")
    wait_for(lambda: "gpus: 0,1" in gq.gpuq("status").stdout, what="worker up")
    proc = gq.gpuq("run", "--gpus", "1,2", check=False)
    assert proc.returncode == 1 and "another worker" in proc.stderr
    other = subprocess.run(
        [sys.executable, "-m", "gpuq", "run", "--gpus", "2"],
        cwd=gq.work,
        env=gq.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.returncode == 0, other.stderr  # disjoint: allowed (and exits, queue empty)


def test_stop_kill_jobs_stops_worker_and_jobs(gq: Env) -> None:
    gq.script("slow.py", "import time; time.sleep(60)\n")
    gq.gpuq("run", "--daemon", timeout=30)
    job_id = gq.add("slow.py")
    pid = wait_for(lambda: gq.job(job_id).get("pid"), what="job pid")
    out = gq.gpuq("stop", "--kill-jobs", timeout=60).stdout
    assert "stopped worker" in out and f"killed job #{job_id}" in out
    assert gq.state_of(job_id) == "cancelled"
    wait_for(lambda: _gone(pid), what="job process gone")


def test_stop_kill_jobs_passes_over_a_job_that_ended_meanwhile(gq: Env) -> None:
    """`stop --kill-jobs` lists the running jobs, then kills them one by one: one that ended by
    itself in between is said, not a failure (CI met it: `job #23 is done, not running`, exit 1)."""
    from gpuq.engine.lifecycle import actions
    from gpuq.spool import Spool

    gq.script("short.py", WAIT_FOR_GO)
    job_id = gq.add("short.py")
    gq.start_worker()  # after the add: a foreground worker that finds nothing to do exits
    gq.wait_state(job_id, "running")
    sp = Spool(gq.home)
    listing = actions.jobs_in(sp, ("running",))  # the listing stop --kill-jobs takes...
    (gq.work / "go").write_text("")  # ...then the job ends by itself before its turn
    gq.wait_state(job_id, "done")  # its done copy written: the running one may still be there
    wait_for(lambda: not gq.files("running"), what="the move's second half (the running copy removed)")
    assert [(job.id, ended) for job, ended in actions.kill_each(sp, listing)] == [(job_id, "done")]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"  # a zombie is gone for good
    except FileNotFoundError:
        return True


def _spares(worker_pid: int) -> list:
    """Spare supervisors of this worker (`--spare-fd`, named `gpuq-spare` until a job comes)."""
    import psutil

    found = []
    try:
        children = psutil.Process(worker_pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            spare = child.name() == "gpuq-spare" or "--spare-fd" in child.cmdline()
            # a spare that got a job is that job's supervisor now: it has a child (or has ended)
            if spare and child.status() != psutil.STATUS_ZOMBIE and not child.children():
                found.append(child)
        except psutil.Error:
            continue  # exited meanwhile
    return found


def _one_spare(worker_pid: int) -> list:
    """The spare, once a supervisor that just finished its job has left (both look idle)."""
    found = _spares(worker_pid)
    return found if len(found) == 1 else []


def test_pre_started_supervisor_runs_jobs_and_its_loss_is_harmless(gq: Env) -> None:
    gq.script("ok.py", "print('ran')\n")
    gq.script("slow.py", "import time; time.sleep(60)\n")
    worker = gq.start_worker("--watch")
    gq.wait_state(gq.add("ok.py"), "done")
    blocker = gq.add("slow.py")
    gq.wait_state(blocker, "running")
    [spare] = wait_for(lambda: _one_spare(worker.pid), what="a spare supervisor while a job runs")
    spare.kill()  # a lost spare: the next job must start the ordinary way
    spare.wait(10)
    gq.gpuq("kill", str(blocker))
    assert gq.wait_state(gq.add("ok.py"), "done")["exit_code"] == 0
    [spare] = wait_for(lambda: _one_spare(worker.pid), what="a new spare")
    worker.kill()  # the spare's socket closes with its worker: it leaves too
    worker.wait()
    spare.wait(10)


def test_a_foreground_run_exits_soon_after_the_last_job_ends(gq: Env) -> None:
    """`gpuq run` returned about 5 s after its last job: the supervisor gave up the job's claim
    after the worker's last look, and the worker then slept a whole rescan period."""
    for _round in range(2):  # once with a supervisor the worker started, once with a spare
        job_id = gq.add("true")
        # Its periodic look ten minutes away: returning within the minute, it did not sleep until then.
        command = [sys.executable, "-c", LOOKS_RARELY, "run"]
        proc = subprocess.run(command, cwd=gq.work, env=gq.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "queue empty" in proc.stdout, proc
        assert gq.state_of(job_id) == "done"
