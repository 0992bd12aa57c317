"""A job whose supervisor was SIGKILLed while the job completed: its exit code is lost, but its log
or progress file shows it reached its end. Recovery says so and does not run it again unless a
person names it (`recover --jobs ID`); a job cut short is still re-queued as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import Env, alive, wait_for

# A training of 10 steps: each start is counted in GATE.runs; it stops after step `stop` until the
# test writes the file GATE, then reports the rest (if any) and exits 0. `how`: where it reports,
# its log ("Step N/10" lines) or its progress file (GPUQ_PROGRESS_FILE).
TRAIN = """\
import json, os, sys, time
how, stop, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open(gate + '.runs', 'a').write('run\\n')

def report(step):
    if how == 'log':
        print(f'Step {step}/10', flush=True)
    else:
        tmp = os.environ['GPUQ_PROGRESS_FILE'] + '.tmp'
        with open(tmp, 'w') as fh:
            json.dump({'step': step, 'total': 10}, fh)
        os.replace(tmp, os.environ['GPUQ_PROGRESS_FILE'])

for step in range(1, stop):
    report(step)
print('waiting', flush=True)
while not os.path.exists(gate):
    time.sleep(0.02)
for step in range(stop, 11):
    report(step)
"""


def _kill_supervisor_then_open(gq: Env, job_id: int, gate: str, then_kill_job: bool = False) -> None:
    """SIGKILL the job's supervisor while the job runs; then let the job finish by itself (or
    kill it too: the machine went down), and wait until both are gone."""
    job = wait_for(lambda: (j := gq.job(job_id)).get("pid") and j.get("supervisor") and j, what="pid recorded")
    wait_for(lambda: "waiting" in gq.log(job_id), what="the job at its gate")
    supervisor, pid = job["supervisor"]["pid"], job["pid"]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not alive(supervisor), what="supervisor gone")
    if then_kill_job:
        os.killpg(pid, signal.SIGKILL)
    (gq.work / gate).touch()
    wait_for(lambda: not alive(pid), what="job gone")


@pytest.mark.parametrize("how", ["log", "progress"])
def test_a_job_that_reached_its_end_is_not_run_again_unasked(gq: Env, how: str) -> None:
    gq.script("train.py", TRAIN)
    ended = gq.add("train.py", how, "9", "a")  # its supervisor killed as it completes
    cut = gq.add("train.py", "log", "6", "b")  # it and its supervisor killed at step 5
    worker = gq.start_worker("--watch")
    _kill_supervisor_then_open(gq, ended, "a")
    job = gq.wait_state(ended, "interrupted")
    assert "reached its end: step 10/10; exit code unknown" in job["note"]
    _kill_supervisor_then_open(gq, cut, "b", then_kill_job=True)
    assert "reached its end" not in gq.wait_state(cut, "interrupted")["note"]
    worker.terminate()
    worker.wait(30)

    listing = gq.gpuq("recover").stdout  # no terminal: it says what it would do
    assert f"#{ended} " in listing and "reached its end: step 10/10; exit code unknown" in listing
    assert f"`gpuq recover --jobs {ended}` runs it again" in listing
    assert f"#{cut} " in listing and "lost 5 steps" in listing and "would re-queue 1 job" in listing
    assert "Re-queued 1 job." in gq.gpuq("recover", "--all").stdout
    assert (gq.state_of(ended), gq.state_of(cut)) == ("interrupted", "pending")
    gq.gpuq("run", timeout=60)
    assert gq.state_of(cut) == "done"

    started = gq.gpuq("run", "--recover", timeout=60)  # a worker that recovers at its start leaves it too
    assert f"job #{ended} work/train reached its end: step 10/10; exit code unknown: left for you" in started.stdout
    assert gq.state_of(ended) == "interrupted"
    assert (gq.work / "a.runs").read_text() == "run\n"

    named = gq.gpuq("recover", "--jobs", str(ended)).stdout  # named: run again, as asked
    assert "Re-queued 1 job." in named
    gq.gpuq("run", timeout=60)
    assert gq.state_of(ended) == "done"
    assert (gq.work / "a.runs").read_text() == "run\nrun\n"


# Runs the command given after it as its child, as a subreaper (Linux's PR_SET_CHILD_SUBREAPER) that
# never reaps: a job whose supervisor is killed becomes its child, and a zombie once it ends, until
# the test closes its stdin (as under a container's init that reaps late, or never).
KEEPER = """import ctypes, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
    sys.exit(3)
subprocess.Popen(sys.argv[1:])
sys.stdin.read()
"""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_a_job_left_a_zombie_is_dead_and_recovered_when_named(gq: Env) -> None:
    """Its supervisor and it killed, nobody having looked since: `recover --jobs N` said `job #N is
    running, not interrupted` while its process was a zombie (exited, not reaped). Recover looks
    first, as `status` does: a zombie is a dead job."""
    job_id = gq.add("sleep", "300")
    command = [sys.executable, "-c", KEEPER, sys.executable, "-m", "gpuq", "run", "--watch"]
    out = open(gq.work / "keeper.out", "wb")
    keeper = subprocess.Popen(command, cwd=gq.work, env=gq.env, stdin=subprocess.PIPE, stdout=out, stderr=out)
    try:
        recorded = lambda: keeper.poll() == 3 or ((j := gq.job(job_id)).get("supervisor") and j)  # noqa: E731
        job = wait_for(recorded, 20, what="the supervisor recorded")
        if job is True:
            pytest.skip("no PR_SET_CHILD_SUBREAPER here (not Linux)")
        gq.gpuq("stop")  # the job keeps running: no worker looks at it from now on
        supervisor, pid = job["supervisor"]["pid"], job["pid"]
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: not alive(supervisor), what="supervisor gone")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _zombie(pid), what="the job a zombie, its new parent reaping nothing")
        named = gq.gpuq("recover", "--jobs", str(job_id), check=False)
        assert _zombie(pid), "still a zombie when recover looked"
        assert named.returncode == 0 and "Re-queued 1 job." in named.stdout, named.stderr
        assert gq.state_of(job_id) == "pending"
        assert [h["outcome"] for h in gq.job(job_id)["history"]] == ["interrupted"]
    finally:
        assert keeper.stdin is not None
        keeper.stdin.close()  # it exits; init reaps what it kept
        keeper.wait(30)
        out.close()
