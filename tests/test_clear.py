"""`gpuq clear` removes finished jobs and their logs but keeps what `gpuq history` counts and the run
times the ETA learns from (the spool's kept-runs); `--state` and `--older-than` choose which jobs;
it says what it will remove and, on a terminal, asks."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from conftest import Env, wait_for
from test_history import svg_ids

from gpuq.engine.tracking import eta
from gpuq.spool import Spool

# Five steps, then it waits for the test (its gate, named by its id) before it ends: the time after
# its last step is the tail the ETA learns.
TRAIN = """\
import os, time
for step in range(1, 6):
    print(f'Step {step}/5', flush=True)
gate = 'go-' + os.environ['GPUQ_JOB_ID']
while not os.path.exists(gate):
    time.sleep(0.02)
"""


def _run_to_its_end(gq: Env, job_id: int) -> None:
    """Let the job reach its last step, look at it (the look records the sample the tail is learned
    from), then let it end."""
    wait_for(lambda: "Step 5/5" in gq.log(job_id), 30, what=f"job {job_id} at its last step")
    gq.gpuq("eta", str(job_id))
    (gq.work / f"go-{job_id}").touch()
    gq.wait_state(job_id, "done", timeout=30)


def _pending_line(gq: Env, job_id: int) -> str:
    return next(line for line in gq.gpuq("eta").stdout.splitlines() if line.startswith(f"#{job_id} "))


def test_history_and_learned_run_times_are_the_same_after_a_clear(gq: Env) -> None:
    gq.script("train.py", TRAIN)
    gq.script("bad.py", "raise SystemExit(3)\n")
    worker = gq.start_worker("--watch")
    learned = [gq.add("train.py") for _ in range(3)]
    for job_id in learned:
        _run_to_its_end(gq, job_id)
    failed = gq.add("bad.py")
    gq.wait_state(failed, "failed")
    blocker = gq.add("train.py")  # holds the one slot, so that the next one waits with an ETA
    wait_for(lambda: "Step 5/5" in gq.log(blocker), 30, what="the blocker running")
    waiting = gq.add("train.py")

    history = gq.gpuq("history", "--json").stdout
    line = _pending_line(gq, waiting)
    assert "median of 3 earlier runs" in line
    spool = Spool(gq.home)
    tail = eta.learned_tail(eta.past_ends(spool, spool.jobs.load(spool.jobs.find(waiting)), float("inf")))[:2]
    assert tail[1] == 3 and tail[0] > 0

    out = gq.gpuq("clear").stdout  # no terminal: it does what it says
    assert gq.files("done") == gq.files("failed") == []
    assert not any((gq.home / "logs" / f"{i:06d}.log").exists() for i in [*learned, failed])
    assert gq.gpuq("history", "--json").stdout == history
    assert json.loads(history)[0]["runs"] == 4
    assert _pending_line(gq, waiting) == line
    assert eta.learned_tail(eta.past_ends(spool, spool.jobs.load(spool.jobs.find(waiting)), float("inf")))[:2] == tail
    assert out.splitlines()[0] == (
        "will remove 4 finished jobs (3 done, 1 failed) and their logs; their history and learned run times are kept"
    )
    assert "removed 4 finished jobs" in out
    (gq.work / f"go-{blocker}").touch()
    (gq.work / f"go-{waiting}").touch()
    gq.wait_state(waiting, "done", timeout=30)
    worker.terminate()
    worker.wait(30)
    assert json.loads(gq.gpuq("history", "--json").stdout)[0]["runs"] == 6  # the kept runs and the new ones


def _age(gq: Env, job_id: int, days: float) -> None:
    """The job as if it had run `days` ago: its times moved back (its file rewritten through the spool)."""
    spool = Spool(gq.home)
    ref = spool.jobs.find(job_id)
    job = spool.jobs.load(ref)
    back = {}
    for field in ("created_at", "started_at", "finished_at"):
        if job.get(field):
            back[field] = (datetime.fromisoformat(job[field]) - timedelta(days=days)).isoformat()
    spool.jobs.rewrite(ref, job, **back)


def test_state_and_older_than_choose_what_is_cleared(gq: Env) -> None:
    gq.script("ok.py", "")
    gq.script("bad.py", "raise SystemExit(3)\n")
    old_done, new_done, old_failed = gq.add("ok.py"), gq.add("ok.py"), gq.add("bad.py")
    gq.gpuq("run")
    cancelled = gq.add("ok.py")
    gq.gpuq("cancel", str(cancelled))
    _age(gq, old_done, 10)
    _age(gq, old_failed, 10)

    out = gq.gpuq("clear", "--older-than", "7d", "--state", "done").stdout
    assert out.startswith("will remove 1 finished job (1 done) and their logs")
    assert [gq.state_of(i) for i in (old_done, new_done, old_failed, cancelled)] == [
        None,
        "done",
        "failed",
        "cancelled",
    ]

    out = gq.gpuq("clear", "--state", "failed,cancelled", "--older-than", "7d").stdout
    assert out.startswith("will remove 1 finished job (1 failed)")
    assert [gq.state_of(i) for i in (new_done, old_failed, cancelled)] == ["done", None, "cancelled"]

    out = gq.gpuq("clear", "--state", "cancelled", "--state", "failed").stdout
    assert out.startswith("will remove 1 finished job (1 cancelled)")
    assert "no finished jobs to clear" in gq.gpuq("clear", "--state", "failed").stdout
    assert [gq.state_of(i) for i in (new_done, cancelled)] == ["done", None]

    for bad, why in (("--state=running", "not a finished state"), ("--older-than=7", "needs a unit")):
        refused = gq.gpuq("clear", bad, check=False)
        assert refused.returncode == 2 and why in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert gq.state_of(new_done) == "done"


def _on_a_terminal(gq: Env, args: list[str], answer: bytes = b"") -> str:
    """`gpuq ARGS` with a terminal for stdin and stdout (a pty); `answer` typed once it asks."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq", *args], cwd=gq.work, env=gq.env, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    seen = bytearray()

    def read() -> bool:
        if select.select([master], [], [], 0.05)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other side closed: it exited
                return True
            seen.extend(chunk)
            return not chunk
        return proc.poll() is not None and not select.select([master], [], [], 0)[0]

    try:
        if answer:
            wait_for(lambda: read() or b"[y/N]" in seen, 60, what="the question")
            os.write(master, answer)
        wait_for(read, 60, what="gpuq to end")
        proc.wait(60)
    finally:
        os.close(master)
    return seen.decode().replace("\r\n", "\n")


def test_it_asks_on_a_terminal(gq: Env) -> None:
    gq.script("ok.py", "")
    first, second = gq.add("ok.py"), gq.add("ok.py")
    gq.gpuq("run")

    out = _on_a_terminal(gq, ["clear"], b"n\n")
    assert "will remove 2 finished jobs (2 done) and their logs" in out and "Go ahead? [y/N]" in out
    assert "nothing removed" in out and gq.state_of(first) == "done"

    out = _on_a_terminal(gq, ["clear", "--state", "done"], b"y\n")
    assert "Go ahead? [y/N] y\nremoved 2 finished jobs" in out
    assert gq.state_of(first) is None and gq.state_of(second) is None

    third = gq.add("ok.py")
    gq.gpuq("run")
    out = _on_a_terminal(gq, ["clear", "--yes"])  # -y: not asked, on a terminal too
    assert "Go ahead" not in out and "removed 1 finished job" in out and gq.state_of(third) is None


def test_log_show_and_triage_say_a_log_dropped_by_clear_logs_is_gone(gq: Env) -> None:
    """After `gpuq clear --logs`, `gpuq log` says on stderr that the log was removed (exit 0, as for a
    job that never started; it printed nothing), and `show` and `triage` no longer give the path as
    if the file were there."""
    gq.script("hi.py", "print('hello')\n")
    job_id = gq.add("hi.py")
    gq.gpuq("run")
    path = str(gq.home / "logs" / f"{job_id:06d}.log")
    assert "hello" in gq.gpuq("log", str(job_id)).stdout
    gq.gpuq("clear", "--logs", "-y")
    assert not os.path.exists(path)
    said = gq.gpuq("log", str(job_id))
    assert (
        said.stdout == ""
        and said.stderr
        == f"#{job_id}: its log {path} was removed (`gpuq clear --logs` removes the logs of finished jobs)\n"
    )
    for command in ("show", "triage"):
        line = next(
            line for line in gq.gpuq(command, str(job_id)).stdout.splitlines() if line.strip().startswith("log ")
        )
        assert line.endswith(f"{path} was removed (`gpuq clear --logs` removes the logs of finished jobs)"), line
    assert json.loads(gq.gpuq("triage", "--json", str(job_id)).stdout)["log_gone"].startswith("was removed")


def test_clear_logs_announces_only_the_logs_it_removes(gq: Env) -> None:
    """`clear --logs` announced every finished job (a cancelled one that never ran, an adopted job
    whose log is its own and stays), then dropped fewer; run again it announced them all and asked
    `Go ahead?` to drop none."""
    gq.script("hi.py", "print('hello')\n")
    ran = gq.add("hi.py")
    gq.gpuq("run")
    never_ran = gq.add("--hold", "hi.py")
    gq.gpuq("cancel", str(never_ran))
    own_log = gq.work / "hand.log"
    with open(own_log, "wb") as out:
        by_hand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=out)
    try:
        adopted = int(gq.gpuq("adopt", str(by_hand.pid), "--log", str(own_log)).stdout.split("#")[1].split(":")[0])
    finally:
        by_hand.kill()
        by_hand.wait()
    wait_for(lambda: gq.gpuq("status", "-a") and gq.state_of(adopted) == "done", 30, what="the adopted job's end")

    out = gq.gpuq("clear", "--logs", "-y").stdout
    assert out.startswith("will remove the logs of 1 finished job (1 done);"), out
    assert "dropped the logs of 1 finished job" in out and own_log.exists()
    assert not (gq.home / "logs" / f"{ran:06d}.log").exists()
    out = _on_a_terminal(gq, ["clear", "--logs"])  # nothing left: nothing announced, nothing asked
    assert out == "no finished jobs with a log left to clear\n", out


def test_history_of_a_cleared_job_says_it_was_cleared(gq: Env) -> None:
    """`gpuq history ID` of a cleared job said `no such job #1`, though `history` still counts its runs."""
    gq.script("hi.py", "print('hello')\n")
    job_id = gq.add("--name", "exp/hi", "hi.py")
    gq.gpuq("run")
    gq.gpuq("clear", "-y")
    assert "total: 1 run" in gq.gpuq("history").stdout
    said = gq.gpuq("history", str(job_id), check=False)
    assert said.returncode == 1 and said.stdout == ""
    assert said.stderr == (
        f"gpuq: job #{job_id} exp/hi was cleared by `gpuq clear` (it ended done): the details of its attempts"
        " went with it; `gpuq history` still counts its runs\n"
    )
    assert gq.gpuq("history", str(job_id + 1), check=False).stderr == f"gpuq: no such job #{job_id + 1}\n"


def test_history_plot_of_a_cleared_job_draws_the_runs_clear_kept(gq: Env) -> None:
    """`gpuq history ID --plot FILE` of a cleared job said `no such job #1` and wrote nothing, though
    `history --plot` of all jobs drew its run from what `clear` kept: it draws that run now."""
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    gq.script("hi.py", "print('hello')\n")
    job_id = gq.add("--name", "exp/hi", "hi.py")
    gq.gpuq("run")
    gq.gpuq("clear", "-y")
    out = gq.work / "one.svg"
    assert gq.gpuq("history", str(job_id), "--plot", str(out)).stdout == f"wrote {out}: 1 run\n"
    bars = [i for i in svg_ids(out) if i.startswith("gpuq-run-")]
    assert len(bars) == 1 and bars[0].startswith(f"gpuq-run-{job_id}-1-"), bars
    missing = gq.gpuq("history", str(job_id + 1), "--plot", str(gq.work / "none.svg"), check=False)
    assert (missing.returncode, missing.stderr) == (1, f"gpuq: no such job #{job_id + 1}\n")
    assert not (gq.work / "none.svg").exists()
