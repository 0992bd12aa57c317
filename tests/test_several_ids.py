"""Commands of several job ids (issue 24): each id they can act on is acted on, each one they cannot
is named on stderr with the reason, and they exit 1 if any was refused. `cancel` of a running job
kills it, as Slurm's scancel does; `kill` says nothing before it knows the job is running."""

from __future__ import annotations

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.core import transitions
from gpuq.spool import Spool

# (the command, the state its jobs are in, the state it leaves them in)
SEVERAL = [
    (("cancel",), "pending", "cancelled"),
    (("hold",), "pending", "held"),
    (("release",), "held", "pending"),
    (("retry",), "cancelled", "pending"),
    (("resume",), "interrupted", "pending"),
    (("recover", "--jobs"), "interrupted", "pending"),
]


def jobs_in(gq: Env, state: str, count: int) -> list[int]:
    """`count` jobs in `state`: queued, then moved there as a cancel or a lost machine leaves them."""
    ids = [gq.add("--gpus", "0", *(["--hold"] if state == "held" else []), "--", "true") for _ in range(count)]
    if state in ("cancelled", "interrupted"):
        spool = Spool(gq.home)
        for job_id in ids:
            ref = spool.jobs.find(job_id)
            assert ref is not None
            changes = transitions.cancel() if state == "cancelled" else {"note": "its machine went down"}
            spool.jobs.move(ref, spool.jobs.load(ref), state, changes)
    return ids


@pytest.mark.parametrize("command,before,after", SEVERAL, ids=[" ".join(c) for c, _b, _a in SEVERAL])
def test_a_bad_id_in_the_middle_is_named_and_the_others_are_acted_on(
    gq: Env, command: tuple[str, ...], before: str, after: str
) -> None:
    first, last = jobs_in(gq, before, 2)
    proc = gq.gpuq(*command, str(first), "999", str(last), check=False)
    # `recover` also says, as `add` does, that no worker runs to start what it queued
    said = proc.stderr.splitlines()
    hint = f"gpuq recover: no worker is running; #{first}, #{last} wait for `gpuq run --daemon`"
    assert proc.returncode == 1 and said[0] == "gpuq: no such job #999", proc
    assert [line.split(" (or ")[0] for line in said[1:]] == ([hint] if command[0] == "recover" else [])
    assert f"#{first}" in proc.stdout and f"#{last}" in proc.stdout, proc.stdout
    assert [gq.state_of(first), gq.state_of(last)] == [after, after]


def test_resume_takes_a_range_and_says_why_one_in_it_cannot_go(gq: Env) -> None:
    first = jobs_in(gq, "interrupted", 1)[0]
    middle = gq.add("--gpus", "0", "--", "true")
    last = jobs_in(gq, "interrupted", 1)[0]
    proc = gq.gpuq("resume", f"{first}-{last}", check=False)
    assert proc.returncode == 1 and proc.stderr == f"gpuq: job #{middle} is already pending; nothing to resume\n"
    assert proc.stdout.count("back in the queue (first in line)") == 2, proc.stdout
    assert gq.state_of(first) == gq.state_of(last) == "pending"


def test_kill_and_cancel_of_running_jobs(gq: Env) -> None:
    Gpus(gq, fake_gpus(2))  # two jobs run at once
    gq.script("wait.py", "import os\nopen('started-' + os.environ['GPUQ_JOB_ID'], 'w').close()\n" + WAIT_FOR_GO)
    first, second, third = (gq.add("--gpus", "1", "wait.py") for _ in range(3))
    cancelled = gq.add("--gpus", "1", "wait.py")
    gq.gpuq("cancel", str(cancelled))
    gq.start_worker("--watch")

    def running(job_id: int) -> bool:
        return (gq.work / f"started-{job_id}").exists() and gq.state_of(job_id) == "running"

    wait_for(lambda: running(first) and running(second), 15, what="two jobs running")
    # A job that is not running in the middle: nothing is said of it on stdout, nothing is sent.
    proc = gq.gpuq("kill", str(first), str(cancelled), str(second), check=False)
    assert proc.returncode == 1 and proc.stderr == f"gpuq: job #{cancelled} is cancelled, not running\n", proc
    assert f"#{cancelled}" not in proc.stdout, proc.stdout
    assert proc.stdout.count("sending SIGTERM") == 2 and proc.stdout.count(" killed (exit 143)") == 2, proc.stdout
    assert [gq.job(i)["exit_code"] for i in (first, second)] == [143, 143]
    assert gq.state_of(first) == gq.state_of(second) == "cancelled"
    # `cancel` of a running job kills it (as `gpuq kill` does) and says so.
    wait_for(lambda: running(third), 15, what="the third job running")
    proc = gq.gpuq("cancel", str(third))
    assert proc.stdout.splitlines() == [
        f"sending SIGTERM to job #{third}'s process group (SIGKILL after 10s)...",
        f"[-] Job #{third}: {gq.job(third)['name']} cancelled: it was running, killed (exit 143)",
    ]
    job = gq.job(third)
    assert (job["state"], job["exit_code"], job["signal"]) == ("cancelled", 143, "SIGTERM")


def test_cancel_of_a_running_job_and_the_next_in_line_never_starts_that_one(gq: Env) -> None:
    """The slot the killed job frees is not handed to a job listed after it: those not running are
    taken out of line first (as scancel and pueue do). `kill` of both refuses the pending one first."""
    Gpus(gq, fake_gpus(1))  # one job at a time
    gq.script("wait.py", "import os\nopen('started-' + os.environ['GPUQ_JOB_ID'], 'w').close()\n" + WAIT_FOR_GO)
    first, second, third, fourth = (gq.add("--gpus", "1", "wait.py") for _ in range(4))
    gq.start_worker("--watch")
    wait_for(lambda: gq.state_of(first) == "running", 15, what="the first job running")
    proc = gq.gpuq("cancel", f"{first}-{second}")
    assert proc.stdout.count("sending SIGTERM") == 1 and proc.stderr == "", proc
    assert gq.state_of(first) == gq.state_of(second) == "cancelled"
    assert not (gq.work / f"started-{second}").exists() and not gq.job(second).get("started_at")
    wait_for(lambda: gq.state_of(third) == "running", 15, what="the third job running")
    proc = gq.gpuq("kill", str(third), str(fourth), check=False)
    assert proc.returncode == 1 and proc.stderr == f"gpuq: job #{fourth} is pending, not running\n", proc
    assert proc.stdout.count("sending SIGTERM") == 1, proc.stdout
    (gq.work / "go").touch()
    assert gq.wait_state(fourth, "done")["exit_code"] == 0
    gq.gpuq("stop")
