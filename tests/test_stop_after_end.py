"""A stop request (preempt, kill, cancel) that a job outruns: one that reached its end and exited 0
is done, not preempted or cancelled; and a kill of a job whose supervisor is gone says its exit
code is unknown. Real workers, real jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for

# Ignores SIGTERM, waits for the test's `go`, then prints its steps up to argv[1] of 3 and exits 0.
STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: print('SIGTERM: finishing first', flush=True))\n"
    "print('step 1/3', flush=True)\n"
    "open('started', 'w').close()\n"
    "while not os.path.exists('go'):\n"
    "    time.sleep(0.02)\n"
    "for s in range(2, int(sys.argv[1]) + 1):\n"
    "    print(f'step {s}/3', flush=True)\n"
    "open('ends.txt', 'a').write('end\\n')\n"
)


@pytest.mark.parametrize(
    ("command", "last", "state", "what"),
    [
        ("preempt", 3, "done", "preemption"),
        ("kill", 3, "done", "kill"),
        ("cancel", 3, "done", "cancel"),
        ("preempt", 2, "preempted", None),  # exit 0 short of its end: saved on SIGTERM, still preempted
    ],
)
def test_a_job_that_reaches_its_end_before_a_stop_takes_effect_is_done(
    gq: Env, command: str, last: int, state: str, what: str
) -> None:
    gq.script("stubborn.py", STUBBORN)
    job_id = gq.add("stubborn.py", str(last))
    after = gq.add("--after", str(job_id), "--", "true")
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "started").exists() and gq.job(job_id).get("pid"), 15, what="the job running")
    stop = subprocess.Popen(
        [sys.executable, "-m", "gpuq", command, str(job_id)],
        cwd=gq.work, env=gq.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: "SIGTERM: finishing first" in gq.log(job_id), 15, what="the request and its SIGTERM")
        (gq.work / "go").touch()
        said = stop.communicate(timeout=30)[0]
    finally:
        if stop.poll() is None:
            stop.kill()
    job = gq.wait_state(job_id, state)
    assert job["exit_code"] == 0 and (gq.work / "ends.txt").read_text() == "end\n"
    assert not (gq.home / "control" / f"{job_id:06d}.json").exists()
    if state == "preempted":
        assert gq.state_of(after) == "pending" and "blocked" in gq.gpuq("status").stdout
        return
    why = f"ended with its work complete (step 3/3) before the {what} took effect"
    assert job["note"] == why and why in gq.log(job_id), (job["note"], gq.log(job_id))
    assert not job.get("preemptions")
    assert ("ended on its own meanwhile: done" if command == "preempt" else f"done: {why}") in said, said
    gq.wait_state(after, "done")  # its dependent is not blocked
    assert "(exit" not in said


@pytest.mark.parametrize(("command", "said"), [("kill", "killed"), ("cancel", "cancelled: it was running, killed")])
def test_a_kill_after_its_supervisor_died_says_the_exit_code_is_unknown(gq: Env, command: str, said: str) -> None:
    gq.script("wait.py", WAIT_FOR_GO)
    job_id = gq.add("wait.py")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("supervisor") and gq.job(job_id).get("pid"), 15, what="the supervisor")
    job = gq.job(job_id)
    worker.kill()
    worker.wait()
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    try:
        proc = gq.gpuq(command, str(job_id))
    finally:
        (gq.work / "go").touch()  # the job ends, whatever happened
    assert f"{said} (exit code unknown: its supervisor was gone)" in proc.stdout, proc.stdout
    assert "None" not in proc.stdout
    assert gq.state_of(job_id) == "cancelled"
