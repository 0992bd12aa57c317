"""The supervisor zygote (run/zygote.py): supervisors forked from it are ordinary supervisors in
their own sessions, outlive the worker and the zygote, and jobs still start without it. Real
worker, real processes, `kill -9`."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import Env, wait_for

from gpuq.run import zygote
from gpuq.run.room import FRESH_ROOM_SECONDS, RESERVE_MIN, released, set_aside, usable
from gpuq.run.supervisor import main as supervisor_main
from gpuq.run.worker import RESCAN_SECONDS
from gpuq.spool import Spool


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


def _one(root_pid: int, name: str) -> list[psutil.Process]:
    found = _named(root_pid, name)
    return found if len(found) == 1 else []


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _forked_run(gq: Env, worker_pid: int) -> tuple[int, psutil.Process, psutil.Process]:
    """A job that waits for the file `go`, run by a supervisor the zygote forked: (job id, its
    supervisor, the zygote)."""
    gq.wait_state(gq.add("true"), "done")  # the first job's start brings the zygote and a spare
    [zyg] = wait_for(lambda: _one(worker_pid, "gpuq-zygote"), 20, what="the zygote")
    wait_for(lambda: _one(zyg.pid, "gpuq-spare"), 20, what="a spare forked by the zygote")
    gq.script("wait.py", "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n")
    job_id = gq.add("wait.py")
    job = gq.wait_state(job_id, "running")
    pid = wait_for(lambda: gq.job(job_id).get("supervisor"), what="the supervisor recorded")["pid"]
    sup = psutil.Process(pid)
    assert job["state"] == "running"
    return job_id, sup, zyg


def test_forked_supervisor_is_its_own_session_and_outlives_worker_and_zygote(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    job_id, sup, zyg = _forked_run(gq, worker.pid)
    assert sup.ppid() == zyg.pid and sup.name() == "gpuq-supervisor"
    assert os.getsid(sup.pid) == sup.pid != os.getsid(zyg.pid)  # a session of its own
    assert zyg.ppid() == worker.pid and os.getsid(zyg.pid) != os.getsid(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    wait_for(lambda: _gone(zyg), 10, what="the zygote to leave with its worker")
    assert sup.is_running() and gq.state_of(job_id) == "running"
    (gq.work / "go").touch()
    assert gq.wait_state(job_id, "done")["exit_code"] == 0  # recorded by the orphaned supervisor
    wait_for(lambda: _gone(sup), 10, what="the supervisor to exit")


def test_zygote_killed_jobs_still_start_and_a_new_zygote_comes(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    job_id, sup, zyg = _forked_run(gq, worker.pid)
    [spare] = wait_for(lambda: _one(zyg.pid, "gpuq-spare"), 20, what="the next spare")
    zyg.kill()  # kill -9: its children live on
    wait_for(lambda: _gone(zyg), 10, what="the zygote gone")
    assert sup.is_running() and spare.is_running()
    spare.kill()  # and the spare it made is lost too: the next job must start the old way
    (gq.work / "go").touch()
    assert gq.wait_state(job_id, "done")["exit_code"] == 0
    for _ in range(3):
        assert gq.wait_state(gq.add("true"), "done")["exit_code"] == 0
    wait_for(lambda: _one(worker.pid, "gpuq-zygote"), 20, what="a new zygote")


def test_zygote_leaves_when_the_worker_stops_and_when_idle(gq: Env) -> None:
    worker = gq.start_worker("--watch")
    gq.wait_state(gq.add("true"), "done")
    gq.wait_state(gq.add("true"), "done")
    [zyg] = wait_for(lambda: _one(worker.pid, "gpuq-zygote"), 20, what="the zygote")
    # nothing to do for a while: it leaves by itself, and the worker collects it
    wait_for(lambda: _gone(zyg), zygote.IDLE_SECONDS + 10, what="an idle zygote to leave")
    wait_for(lambda: not psutil.pid_exists(zyg.pid) or _gone(zyg), 10, what="the zygote collected")
    gq.wait_state(gq.add("true"), "done")
    gq.wait_state(gq.add("true"), "done")
    [zyg] = wait_for(lambda: _one(worker.pid, "gpuq-zygote"), 20, what="a new zygote")
    worker.send_signal(signal.SIGTERM)
    worker.wait(20)
    wait_for(lambda: _gone(zyg), 10, what="the zygote to leave with its worker")


def _wakes(pid: int) -> int:
    """How often the process's main thread has been woken from a sleep (its voluntary context
    switches): an idle worker's wait for its next periodic look is one sleep."""
    with open(f"/proc/{pid}/task/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches:"))


def test_idle_worker_keeps_no_zygote_and_spends_no_cpu(gq: Env) -> None:
    """After a burst, an idle worker is back to what it was: no zygote, no CPU to speak of."""
    worker = gq.start_worker("--watch")
    for _ in range(3):
        gq.wait_state(gq.add("true"), "done")
    wait_for(lambda: not _named(worker.pid, "gpuq-zygote"), zygote.IDLE_SECONDS + 30, what="no zygote when idle")
    proc = psutil.Process(worker.pid)
    before, start, woken = proc.cpu_times(), time.monotonic(), _wakes(worker.pid)
    # The window spans a whole period of its looks and at least one look, by the worker's own
    # clock: a worker that never sleeps never ends it. CPU time is the worker's own, which a busy
    # machine does not add to; the bound is far above what an idle worker spends (its cost is
    # measured in bench/latencies.py) and far below a worker that looks without pause.
    wait_for(
        lambda: time.monotonic() - start >= RESCAN_SECONDS and _wakes(worker.pid) > woken,
        4 * RESCAN_SECONDS + 30,
        interval=0.2,
        what="the idle worker to sleep and wake for a look",
    )
    after = proc.cpu_times()
    used = (after.user + after.system) - (before.user + before.system)
    assert used / (time.monotonic() - start) < 0.02, used  # under 1.2 CPU-s a minute


def test_launcher_and_zygote_agree_on_the_request() -> None:
    from gpuq.run import launcher

    assert launcher.FORK_REQUEST == zygote.FORK_REQUEST  # kept apart: the launcher must not import psutil


def test_a_waiting_spare_keeps_its_room_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare waits for its job for as long as the worker is idle; its room, set aside once, is
    made fresh again while it waits (the same blocks), so that the job it gets at last need not
    set room aside before it starts (run/room.py)."""
    spool = Spool(tmp_path / "spool").ensure()
    room = set_aside(spool)
    inodes = [os.stat(r.path).st_ino for r in room]
    long_ago = time.time() - 2 * FRESH_ROOM_SECONDS
    for reservation in room:
        os.utime(reservation.path, (long_ago, long_ago))
    assert not any(usable(r, RESERVE_MIN, time.time()) for r in room)
    monkeypatch.setattr(supervisor_main, "KEEP_FRESH_SECONDS", 0.05)  # the spare's pace, not a clock
    worker_end, spare_end = socket.socketpair()
    waiting = threading.Thread(target=supervisor_main.wait_for_order, args=(spare_end.detach(), room))
    waiting.start()
    try:
        wait_for(lambda: all(usable(r, RESERVE_MIN, time.time()) for r in room), 5, what="the room made fresh")
    finally:
        worker_end.close()  # the worker gone: the spare gets no job
        waiting.join(5)
    assert not waiting.is_alive()
    assert [os.stat(r.path).st_ino for r in room] == inodes, "the same blocks, not new ones"
    released(room)
