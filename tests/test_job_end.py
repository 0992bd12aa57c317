"""Every end of a job is final (issue 24): whatever is left of its process group when its main
process ends (a DataLoader worker, a torchrun rank, a child that ignores SIGTERM) gets SIGTERM, then
SIGKILL after the worker's --kill-grace, and the job's end is recorded only once they are gone. A
process that left the group on purpose (setsid) is not the job's and is not touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from conftest import Env, alive, wait_for

from gpuq.core.states import KILL, TIME_LIMIT
from gpuq.spool import Spool
from gpuq.system import proctree

# The job's main process starts a child in its own process group that ignores SIGTERM, and a
# daemon that left the group (setsid); then it exits 0 ("exit") or runs until it is stopped.
FAMILY = """\
import os, subprocess, sys, time
stubborn = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.05)\\n"
child = subprocess.Popen([sys.executable, "-c", stubborn])
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open("daemon.pid", "w").write(str(daemon.pid))
def ignores_sigterm(pid):
    line = [s for s in open(f"/proc/{pid}/status") if s.startswith("SigIgn:")][0]
    return int(line.split()[1], 16) & (1 << 14)  # SIGTERM is signal 15
while not ignores_sigterm(child.pid):
    time.sleep(0.01)
open("child.pid", "w").write(str(child.pid))
if sys.argv[1] == "exit":
    sys.exit(0)
while True:
    time.sleep(0.05)
"""


def family(gq: Env, mode: str, *options: str) -> tuple[int, int, int]:
    """A running family job under a worker with a 1 s kill grace: (job id, child pid, daemon pid)."""
    gq.script("family.py", FAMILY)
    job_id = gq.add(*options, "family.py", mode)
    gq.start_worker("--watch", "--kill-grace", "1")
    pid_file = gq.work / "child.pid"
    # written by open().write(): the file exists a moment before its pid is in it
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 15, what="the job's child")
    return job_id, int(pid_file.read_text()), int((gq.work / "daemon.pid").read_text())


def recorded_after_the_child(gq: Env, job_id: int, state: str, child: int, daemon: int) -> dict:
    """The job reaches `state`; its child was gone by then; the daemon (setsid) was not touched."""
    try:
        job = gq.wait_state(job_id, state, timeout=20)
        assert not alive(child), "the job's end was recorded while its child still lived"
        assert alive(daemon), "a process that left the group was killed"
        log = gq.log(job_id)
        assert f"ended with SIGKILL after 1s: {child} python" in log, log
        assert str(daemon) not in log
        return job
    finally:
        for pid in (child, daemon):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_job_that_exits_leaves_nothing_of_its_group(gq: Env) -> None:
    job_id, child, daemon = family(gq, "exit")
    job = recorded_after_the_child(gq, job_id, "done", child, daemon)
    assert job["exit_code"] == 0


def test_a_time_limit_ends_the_whole_group(gq: Env) -> None:
    job_id, child, daemon = family(gq, "run", "--time", "0:00:02")
    job = recorded_after_the_child(gq, job_id, "failed", child, daemon)
    assert job["exit_code"] == 143 and "time limit of 2s reached" in job["reason"]


@pytest.mark.parametrize("command", [("kill",), ("cancel",), ("preempt", "--timeout", "10")])
def test_kill_cancel_and_preempt_end_the_whole_group(gq: Env, command: tuple[str, ...]) -> None:
    job_id, child, daemon = family(gq, "run")
    proc = gq.gpuq(command[0], str(job_id), *command[1:], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = {"kill": "cancelled", "cancel": "cancelled", "preempt": "preempted"}[command[0]]
    recorded_after_the_child(gq, job_id, state, child, daemon)


def test_end_group_reports_what_it_ended(tmp_path: Path) -> None:
    """The library call itself, on a real group: nothing left is one cheap answer; a child that
    ignores SIGTERM is SIGKILLed after the grace; one that obeys goes with SIGTERM."""
    import subprocess
    import sys

    assert proctree.end_group(os.getpid() + 10_000_000, 1.0) is None  # no such group
    script = tmp_path / "leader.py"
    script.write_text(
        "import subprocess, sys\n"
        "ignore = 'import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nprint(1, flush=True)\\n"
        "time.sleep(60)'\n"
        "for code in (ignore, 'import time; print(1, flush=True); time.sleep(60)'):\n"
        "    p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
        "    p.stdout.readline()\n"
        "    print(p.pid, flush=True)\n"
    )
    leader = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None
    stubborn, obedient = int(leader.stdout.readline()), int(leader.stdout.readline())
    leader.wait()
    end: Optional[proctree.GroupEnd] = proctree.end_group(leader.pid, 0.5)
    assert end is not None
    assert end.by_term == [f"{obedient} python"] and end.by_kill == [f"{stubborn} python"] and end.survivors == []
    assert not alive(stubborn) and not alive(obedient)
    assert proctree.end_group(leader.pid, 0.5) is None


SAVES_ON_SIGTERM = """\
import signal, sys, time
def save(*_):
    print("saving", flush=True); time.sleep(3); print("saved", flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_kill_waits_the_workers_kill_grace_for_a_job_that_saves(gq: Env) -> None:
    """`gpuq kill` and `cancel` SIGKILLed after 10 s whatever the worker's --kill-grace: a job saving
    a checkpoint for longer was cut short; with --kill-grace 1 a cancel waited 10 s for nothing."""
    gq.script("saves.py", SAVES_ON_SIGTERM)
    job_id = gq.add("saves.py")
    gq.start_worker("--watch", "--kill-grace", "20")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    out = gq.gpuq("kill", str(job_id), timeout=60).stdout
    assert "(SIGKILL after 20s)" in out and "exit 0" in out, out
    assert "saved" in gq.log(job_id)


STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_kill_says_when_a_job_that_ignores_sigterm_gets_its_sigkill(gq: Env) -> None:
    """Under --kill-grace 1, `gpuq kill` said `SIGKILL after 1s` for a job ignoring SIGTERM, which
    got it after 3 s. The job's supervisor SIGKILLs it once the grace has passed since the kill, and
    the line says that wait."""
    gq.script("stubborn.py", STUBBORN)
    job_id = gq.add("stubborn.py")
    gq.start_worker("--watch", "--kill-grace", "1")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    started = time.monotonic()
    out = gq.gpuq("kill", str(job_id), timeout=60).stdout
    took = time.monotonic() - started
    assert "(SIGKILL after 1s)" in out and 0.9 < took < 10, (out, took)
    assert gq.job(job_id)["exit_code"] == 137
    assert "still running 1s after `gpuq kill`: SIGKILL" in gq.log(job_id)


@pytest.mark.parametrize("command", ["kill", "cancel"])
def test_a_job_that_ignores_sigterm_dies_though_its_killer_was_interrupted(gq: Env, command: str) -> None:
    """A `gpuq kill` (or cancel) interrupted during its wait (Ctrl-C, a closed terminal, a stopped
    `gpuq web`) never sent its SIGKILL: a job ignoring SIGTERM ran on, `stopping since` for ever. Its
    supervisor SIGKILLs it once the grace has passed since the request."""
    gq.script("stubborn.py", STUBBORN)
    job_id = gq.add("stubborn.py")
    gq.start_worker("--watch", "--kill-grace", "1")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    killer = subprocess.Popen(
        [sys.executable, "-m", "gpuq", command, str(job_id)], cwd=gq.work, env=gq.env, stdout=subprocess.PIPE
    )
    assert killer.stdout is not None
    assert "sending SIGTERM" in killer.stdout.readline().decode()  # said just before the request
    wait_for(lambda: (gq.home / "control" / f"{job_id:06d}.json").exists(), 10, what="the request")
    killer.send_signal(signal.SIGINT)
    assert killer.wait(10) != 0
    job = gq.wait_state(job_id, "cancelled", timeout=15)
    assert job["exit_code"] == 137, job
    assert f"still running 1s after `gpuq {command}`: SIGKILL" in gq.log(job_id)


SAVES_ON_EACH_TERM = """\
import os, signal, sys, time
started, past = time.monotonic(), float(sys.argv[1])  # "past" is written that long after its start
def save(*_):
    print("got TERM", flush=True)  # a second SIGTERM starts the save again
    while os.path.exists("hold"):
        if time.monotonic() - started > past and not os.path.exists("past"):
            open("past", "w").close()
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_kill_whose_asker_died_before_its_sigterm_is_sigtermed_by_the_supervisor(gq: Env) -> None:
    """`gpuq kill` writes its request, then sends the SIGTERM: one stopped in between (Ctrl-C) left
    only the request, and the supervisor SIGKILLed the job at the grace, no SIGTERM ever sent: it never
    saved. The supervisor sends the SIGTERM when it finds the request, the SIGKILL a grace later."""
    gq.script("saves.py", SAVES_ON_EACH_TERM)
    (gq.work / "hold").write_text("")  # it saves until killed
    job_id = gq.add("saves.py", "60")
    gq.start_worker("--watch", "--kill-grace", "1")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    Spool(str(gq.home)).control.request(job_id, KILL)  # all an asker stopped at once leaves
    job = gq.wait_state(job_id, "cancelled", timeout=15)
    assert job["exit_code"] == 137, job
    log = gq.log(job_id)
    assert log.count("got TERM") == 1 and "still running 1s after `gpuq kill`: SIGKILL" in log, log


def test_kill_leaves_the_sigterm_to_the_supervisor_so_the_job_gets_one(gq: Env) -> None:
    """A job whose save starts again on a second SIGTERM gets one: `gpuq kill` leaves it to the
    supervisor, which sends it for a request whoever wrote it."""
    gq.script("saves.py", SAVES_ON_EACH_TERM)
    (gq.work / "hold").write_text("")
    job_id = gq.add("saves.py", "60")
    gq.start_worker("--watch", "--kill-grace", "1")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    out = gq.gpuq("kill", str(job_id), timeout=60).stdout
    assert "(SIGKILL after 1s)" in out and gq.job(job_id)["exit_code"] == 137, out
    assert gq.log(job_id).count("got TERM") == 1, gq.log(job_id)


COUNTS_TERMS = """\
import signal, time
def term(*_):
    with open("terms", "a") as out:  # not the log: its supervisor may be the one that writes it
        out.write("TERM\\n")
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_kill_sends_the_sigterm_itself_when_the_supervisor_does_not_say_it_does(gq: Env) -> None:
    """After an upgrade, a job may run on under a supervisor of the earlier gpuq, which sends no
    SIGTERM for a kill request: its record has no `sends_term`, and `gpuq kill` sends it itself, or
    the job would get only the SIGKILL, with no chance to save."""
    gq.script("terms.py", COUNTS_TERMS)
    job_id = gq.add("terms.py")
    gq.start_worker("--watch", "--kill-grace", "30")
    wait_for(lambda: "up" in gq.log(job_id), 15, what="the job to start")
    spool = Spool(str(gq.home))
    ref = spool.jobs.find(job_id)
    assert ref is not None
    job = spool.jobs.load(ref)
    earlier = {k: v for k, v in (job.supervisor or {}).items() if k != "sends_term"}
    spool.jobs.rewrite(ref, job, supervisor=earlier)  # as an earlier supervisor recorded itself
    os.kill(earlier["pid"], signal.SIGSTOP)  # and it does not look for the request either
    killing = subprocess.Popen([sys.executable, "-m", "gpuq", "kill", str(job_id)], cwd=gq.work, env=gq.env)
    try:
        wait_for(lambda: (gq.work / "terms").exists(), 15, what="gpuq kill's own SIGTERM")
    finally:
        killing.kill()
        os.killpg(job.pid, signal.SIGKILL)
        os.kill(earlier["pid"], signal.SIGCONT)
        killing.wait(10)


def test_a_cancel_under_a_short_kill_grace_is_over_soon(gq: Env) -> None:
    gq.script("family.py", FAMILY)
    job_id = gq.add("family.py", "run")
    gq.start_worker("--watch", "--kill-grace", "1")
    wait_for(lambda: (gq.work / "child.pid").exists(), 15, what="the job's child")
    started = time.monotonic()
    out = gq.gpuq("cancel", str(job_id), timeout=60).stdout
    try:
        assert "(SIGKILL after 1s)" in out and time.monotonic() - started < 6, out
    finally:
        daemon = int((gq.work / "daemon.pid").read_text())
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)


SAVES_WHILE_HELD = """\
import os, signal, sys, time
def save(*_):
    print("saving", flush=True)
    while os.path.exists("hold"):
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_job_stopping_at_its_time_limit_says_so_while_it_stops(gq: Env) -> None:
    """Through the kill grace of a job stopped at its --time (saving, say), `status` and `show` showed
    it plainly running; they say it is stopping at its time limit, as they say a `gpuq kill` is."""
    gq.script("saves.py", SAVES_WHILE_HELD)
    (gq.work / "hold").write_text("")  # it saves until the test has looked
    job_id = gq.add("--time", "0:00:01", "saves.py")
    gq.start_worker("--watch", "--kill-grace", "60")
    wait_for(lambda: "saving" in gq.log(job_id), 20, what="the time limit's SIGTERM")
    assert "stopping at its time limit since" in gq.gpuq("status").stdout
    assert "running: stopping at its time limit since" in gq.gpuq("show", str(job_id)).stdout
    row = next(r for r in gq.status_json() if r["id"] == job_id)
    assert row["stopping"]["action"] == "time-limit", row
    (gq.work / "hold").unlink()
    job = gq.wait_state(job_id, "failed", timeout=20)
    assert job["note"] == "stopped: its time limit of 1s was reached", job["note"]
    assert not (gq.home / "control" / f"{job_id:06d}.json").exists()


@pytest.mark.parametrize(
    "options, command, state, note",
    [
        ((), "kill", "cancelled", "killed by user (gpuq kill)"),
        ((), "preempt", "preempted", "preempted by user"),
        (("--preemptible",), "kill", "cancelled", "killed by user (gpuq kill)"),
    ],
)
def test_a_request_made_before_the_time_limit_keeps_its_end(
    gq: Env, options: tuple[str, ...], command: str, state: str, note: str
) -> None:
    """A job saving after `gpuq kill` or `preempt` reached its --time meanwhile: its supervisor's own
    note replaced the person's request, and the job ended failed at its time limit (a --preemptible
    one preempted after a kill); the person's request now ends it. The log said "time limit of 5s
    reached: stopping the job", and the job got a second SIGTERM, though the request stops it."""
    gq.script("saves.py", SAVES_ON_EACH_TERM)
    (gq.work / "hold").write_text("")  # it saves until the time limit has come too
    job_id = gq.add("--time", "0:00:05", *options, "saves.py", "6")
    gq.start_worker("--watch", "--kill-grace", "60")
    wait_for(lambda: "up" in gq.log(job_id), 20, what="the job to start")
    asking = subprocess.Popen(
        [sys.executable, "-m", "gpuq", command, str(job_id)], cwd=gq.work, env=gq.env, stdout=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: "got TERM" in gq.log(job_id), 20, what=f"the SIGTERM of `gpuq {command}`")
        assert "time limit" not in gq.log(job_id), "the time limit came first: the test proves nothing"
        wait_for(lambda: (gq.work / "past").exists(), 20, what="the time limit while it saves")
        (gq.work / "hold").unlink()
        job = gq.wait_state(job_id, state, timeout=20)
        assert job["note"].startswith(note), job["note"]
        log = gq.log(job_id)
        assert "time limit" not in log and log.count("got TERM") == 1, log
    finally:
        asking.kill()
        asking.wait()


def test_the_time_limit_note_takes_only_the_place_of_an_earlier_runs_request(tmp_path: Path) -> None:
    """The supervisor's note at the time limit never goes over a request made in this run; one left
    for an earlier run (ended since) does not keep it out."""
    control = Spool(str(tmp_path / "spool")).ensure().control
    assert control.request_unless_asked(1, TIME_LIMIT, since=time.time() - 60)  # none pending
    control.request(2, KILL)
    assert not control.request_unless_asked(2, TIME_LIMIT, since=time.time() - 60)
    assert control.peek(2) == KILL
    assert control.request_unless_asked(2, TIME_LIMIT, since=time.time() + 60)  # the kill was for a run before
    assert control.peek(2) == TIME_LIMIT
