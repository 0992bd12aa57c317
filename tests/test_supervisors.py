"""Supervisors as processes: each is a session of its own that outlives its worker, the spare kept
ready leaves with the worker, and an idle worker spends no CPU. Real worker, real processes,
`kill -9`. (These replace the zygote's tests: the zygote is gone, its guarantees are not.)"""

from __future__ import annotations

import os
import signal
import time

import psutil
from conftest import WAIT_FOR_GO, Env, wait_for

from gpuq.run.worker import RESCAN_SECONDS


def _named(root_pid: int, name: str) -> list[psutil.Process]:
    """Live descendants of `root_pid` with this process name."""
    try:
        found = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for proc in found:
        try:
            if proc.name() == name and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_supervisor_is_its_own_session_and_outlives_its_worker(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    gq.script("wait.py", WAIT_FOR_GO)
    job_id = gq.add("wait.py")
    pid = wait_for(lambda: gq.job(job_id).get("supervisor"), 20, what="the supervisor recorded")["pid"]
    sup = psutil.Process(pid)
    assert sup.name() == "gpuq-supervisor" and sup.ppid() == worker.pid
    assert os.getsid(sup.pid) == sup.pid != os.getsid(worker.pid)  # a session of its own
    [spare] = wait_for(lambda: _named(worker.pid, "gpuq-spare"), 20, what="a spare kept ready")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    wait_for(lambda: _gone(spare), 10, what="the spare to leave with its worker")
    assert sup.is_running() and gq.state_of(job_id) == "running"
    (gq.work / "go").touch()
    assert gq.wait_state(job_id, "done")["exit_code"] == 0  # recorded by the orphaned supervisor
    wait_for(lambda: _gone(sup), 10, what="the supervisor to exit")


def test_the_spare_leaves_when_the_worker_stops(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    gq.wait_state(gq.add("true"), "done")
    [spare] = wait_for(lambda: _named(worker.pid, "gpuq-spare"), 20, what="a spare kept ready")
    worker.send_signal(signal.SIGTERM)
    worker.wait(20)
    wait_for(lambda: _gone(spare), 10, what="the spare to leave with its worker")


def _wakes(pid: int) -> int:
    """How often the process's main thread has been woken from a sleep (its voluntary context
    switches): an idle worker's wait for its next periodic look is one sleep."""
    with open(f"/proc/{pid}/task/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches:"))


def test_an_idle_worker_spends_no_cpu(gq: Env) -> None:
    """After a burst, an idle worker (and its waiting spare) costs no CPU to speak of."""
    worker = gq.start_worker("--watch")
    for _ in range(3):
        gq.wait_state(gq.add("true"), "done")
    [spare] = wait_for(lambda: _named(worker.pid, "gpuq-spare"), 20, what="a spare kept ready")
    procs = [psutil.Process(worker.pid), spare]
    before, start, woken = [p.cpu_times() for p in procs], time.monotonic(), _wakes(worker.pid)
    # The window spans a whole period of its looks and at least one look, by the worker's own
    # clock: a worker that never sleeps never ends it. CPU time is the processes' own, which a
    # busy machine does not add to; the bound is far above what an idle worker spends (its cost
    # is measured in bench/latencies.py) and far below a worker that looks without pause.
    wait_for(
        lambda: time.monotonic() - start >= RESCAN_SECONDS and _wakes(worker.pid) > woken,
        4 * RESCAN_SECONDS + 30,
        interval=0.2,
        what="the idle worker to sleep and wake for a look",
    )
    after = [p.cpu_times() for p in procs]
    used = sum((a.user + a.system) - (b.user + b.system) for a, b in zip(after, before))
    assert used / (time.monotonic() - start) < 0.02, used  # under 1.2 CPU-s a minute
