"""add, wait, log and show say what will happen (issue 26): the hint when no worker runs, a wait
that stops when nothing will run, the log of a job that has not started, a `show` for a person."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import WAIT_FOR_GO, Env, alive, wait_for

from gpuq.core.transitions import Continuation
from gpuq.core.words import ids_text, plural

NO_WORKER = "no worker is running"


def live_worker(gq: Env) -> None:
    gq.start_worker("--watch")
    wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, 15, what="the worker to register")


def in_background(gq: Env, err: Path, *args: str) -> subprocess.Popen:
    """`gpuq ARGS` left running, its stdout piped and its stderr in `err` (to poll what it said)."""
    with open(err, "w") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuq", *args], cwd=gq.work, env=gq.env, stdout=subprocess.PIPE, stderr=fh, text=True
        )


def test_add_says_when_no_worker_will_start_the_job(gq: Env) -> None:
    gq.script("t.py", "")
    proc = gq.gpuq("add", "t.py")
    assert proc.stderr == f"gpuq add: {NO_WORKER}; #1 waits for `gpuq run --daemon` (or `gpuq service install`)\n"
    assert proc.stdout.startswith("[+] Job #1")
    swept = gq.gpuq("add", "--sweep", "lr=1,2,3", "t.py", "--lr", "{lr}").stderr
    assert f"{NO_WORKER}; #2-#4 wait for `gpuq run --daemon`" in swept
    quiet = gq.gpuq("add", "-q", "t.py")
    assert quiet.stderr == "" and quiet.stdout == "5\n"
    assert gq.gpuq("add", "--hold", "t.py").stderr == ""  # held: it waits for `gpuq release`
    live_worker(gq)
    assert gq.gpuq("add", "t.py").stderr == ""


def test_wait_with_no_worker_stops_at_once_and_says_why(gq: Env) -> None:
    gq.script("t.py", "")
    first, second = gq.add("t.py"), gq.add("t.py")
    started = time.monotonic()
    proc = gq.gpuq("wait", "--timeout", "60", check=False)
    assert proc.returncode == 1 and time.monotonic() - started < 10
    assert proc.stderr == (
        f"gpuq wait: nothing will run: {NO_WORKER}; #{first}, #{second} wait for `gpuq run --daemon`\n"
    )
    assert proc.stdout == ""


def test_wait_goes_on_while_a_job_runs_without_its_worker(gq: Env) -> None:
    gq.script("hold.py", WAIT_FOR_GO)
    gq.script("t.py", "")
    running = gq.add("hold.py")
    live_worker(gq)
    gq.wait_state(running, "running")
    gq.gpuq("stop")  # the job keeps running under its supervisor
    pending = gq.add("t.py")
    err = gq.work / "wait.err"
    waiting = in_background(gq, err, "wait", str(running), str(pending))
    try:
        wait_for(lambda: "waiting for the running ones" in err.read_text(), 10, what="wait's note")
        assert waiting.poll() is None  # still waiting: the running job will end
        (gq.work / "go").write_text("")
        out, _ = waiting.communicate(timeout=20)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1 and gq.state_of(running) == "done" and out == ""
    said = err.read_text().splitlines()
    assert said[-1] == f"gpuq wait: nothing will run: {NO_WORKER}; #{pending} waits for `gpuq run --daemon`"


def test_log_of_a_job_that_has_not_started(gq: Env) -> None:
    gq.script("t.py", "print('hello from the job')\n")
    first = gq.add("t.py")
    after = gq.add("--after", str(first), "t.py")
    held, cancelled = gq.add("--hold", "t.py"), gq.add("t.py")
    gq.gpuq("cancel", str(cancelled))
    for job_id, said in (
        (first, f"#{first} has not started yet (pending: {NO_WORKER}; `gpuq run --daemon` starts one)"),
        (after, f"#{after} has not started yet (pending: after #{first})"),
        (held, f"#{held} has not started yet (held: `gpuq release {held}` puts it back in line)"),
        (cancelled, f"#{cancelled} never started (cancelled before it ran)"),
    ):
        proc = gq.gpuq("log", str(job_id))
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", said + "\n")


def test_log_follow_waits_for_the_job_to_start(gq: Env) -> None:
    gq.script("t.py", "print('hello from the job')\n")
    job_id = gq.add("t.py")
    err = gq.work / "follow.err"
    follow = in_background(gq, err, "log", "-f", str(job_id))
    try:
        wait_for(lambda: f"waiting for #{job_id} to start" in err.read_text(), 10, what="log -f's line")
        assert follow.poll() is None
        gq.start_worker("--watch")
        out, _ = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0 and "hello from the job" in out and "exit 0" in out
    assert (
        err.read_text() == f"waiting for #{job_id} to start (pending: {NO_WORKER}; `gpuq run --daemon` starts one)...\n"
    )


def test_log_follow_stops_for_a_job_that_will_not_start(gq: Env) -> None:
    """`log -f` of a job after a failed one waited for ever while `gpuq wait` stopped at once: it
    stops as `wait` does (exit 1), also once the job it follows is blocked while it waits."""
    gq.script("bad.py", "raise SystemExit(3)\n")
    gq.script("gated_bad.py", WAIT_FOR_GO + "raise SystemExit(3)\n")
    gq.script("t.py", "print('never printed')\n")
    failed = gq.add("bad.py")
    blocked = gq.add("--after", str(failed), "t.py")
    gq.gpuq("run", timeout=60)
    reason = (
        f"pending: blocked: after #{failed} (failed): will not start; `gpuq retry {failed}` or `gpuq cancel {blocked}`"
    )
    proc = gq.gpuq("log", "-f", str(blocked), check=False, timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"#{blocked} will not start ({reason})\n")
    assert gq.gpuq("wait", str(blocked), check=False, timeout=30).returncode == 1

    gated = gq.add("gated_bad.py")
    after = gq.add("--after", str(gated), "t.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.state_of(gated) == "running", 20, what="the gated job to run")
    err = gq.work / "follow.err"
    follow = in_background(gq, err, "log", "-f", str(after))
    try:
        wait_for(
            lambda: f"waiting for #{after} to start (pending: after #{gated}" in err.read_text(), 10, what="log -f"
        )
        assert follow.poll() is None  # its turn comes after #gated: it waits
        (gq.work / "go").write_text("")
        out, _ = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert (follow.returncode, out) == (1, "")
    assert (
        err.read_text()
        .splitlines()[-1]
        .startswith(f"#{after} will not start (pending: blocked: after #{gated} (failed)")
    )


def shown(gq: Env, job_id: int) -> tuple[str, dict[str, str]]:
    """`gpuq show`'s first line, and its label -> text (labels hold single spaces, padding two or more)."""
    head, *rest = gq.gpuq("show", str(job_id)).stdout.splitlines()
    return head, dict((part.strip() for part in line.strip().split("  ", 1)) for line in rest)


def test_show_prints_what_matters_and_json_the_file(gq: Env) -> None:
    gq.script("bad.py", "raise SystemExit(3)\n")
    gq.script("t.py", "")
    ok = gq.add("t.py")
    failed = gq.add("--gpus", "0", "--time", "5m", "bad.py", "--lr", "0.1")
    gq.gpuq("run")
    job_id = gq.add("--after", str(failed), "--after-any", str(ok), "-e", "LR=3e-4", "t.py")
    head, lines = shown(gq, job_id)
    assert head == f"#{job_id} work/t"
    assert lines["directory"] == str(gq.work) and lines["command"].endswith(" t.py")
    assert lines["state"].startswith(f"pending: blocked: after #{failed} (failed): will not start")
    assert lines["after"] == f"#{failed} (failed)" and lines["after any"] == f"#{ok} (done)"
    assert lines["env"] == "LR=3e-4" and "variables inherited from the shell" in lines["shell env"]
    assert lines["log"] == str(gq.home / "logs" / f"{job_id:06d}.log")
    for empty in ("exit code", "started", "checkpoint", "sweep", "preemptions", "time limit", "attempts"):
        assert empty not in lines, empty  # nothing to say: no line
    _head, ended = shown(gq, failed)
    assert ended["state"] == "failed" and ended["exit code"] == "3" and ended["command"].endswith("bad.py --lr 0.1")
    assert ended["GPUs"] == "none (a CPU job)" and ended["time limit"] == "5m00s"
    assert {"queued", "started", "finished", "ran for"} <= set(ended)
    assert len(lines) < 20 and len(ended) < 20  # against some 60 fields in the file
    # --json: the job file as it is, with its state, file name and GPU record (none yet)
    name = gq.files("pending")[0]
    on_disk = json.loads((gq.home / "pending" / name).read_text())
    assert json.loads(gq.gpuq("show", "--json", str(job_id)).stdout) == dict(
        on_disk, state="pending", file=name, gpu_use=None
    )


def test_counts_and_ids_read_as_sentences() -> None:
    assert (plural(1, "step"), plural(0, "step"), plural(3, "step")) == ("1 step", "0 steps", "3 steps")
    assert ids_text([4, 3]) == "#3, #4" and ids_text([12, 13, 14, 15, 20]) == "#12-#15, #20"
    assert Continuation("/c/checkpoint-10", 10, 11).text() == "continues from checkpoint-10 (lost 1 step)"


def test_wait_names_what_moves_a_held_job_on_and_recover_of_no_job_says_only_that(gq: Env) -> None:
    """`wait` said `#1 held: held`; `recover --jobs 9999` printed `Re-queued 0 jobs.` beside its error."""
    held = gq.add("--hold", "true")
    live_worker(gq)  # the held job is what stops the wait, not a missing worker
    proc = gq.gpuq("wait", str(held), check=False)
    assert (proc.returncode, proc.stdout) == (1, f"#{held} held: waits for `gpuq release {held}`\n")
    proc = gq.gpuq("recover", "--jobs", "9999", check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "gpuq: no such job #9999\n")


def test_wait_does_not_wait_for_a_damaged_file(gq: Env) -> None:
    """A file in preempted/ that is no valid job (cut short by a crash) counted as pending, a victim
    the worker resumes by itself: with a worker running, `gpuq wait` waited for it until --timeout
    (for ever without one). It never runs: wait says so on stderr, once, and waits for the others."""
    gq.script("hold.py", WAIT_FOR_GO)
    running, damaged = gq.add("hold.py"), gq.add("--hold", "true")
    live_worker(gq)
    gq.wait_state(running, "running")
    name = gq.files("held")[0]
    (gq.home / "held" / name).rename(gq.home / "preempted" / name)
    (gq.home / "preempted" / name).write_text(f'{{"schema_version": 1, "id": {damaged}, "na')
    said = f"gpuq wait: job #{damaged}: file is damaged: not valid JSON"
    started = time.monotonic()
    proc = gq.gpuq("wait", str(damaged), "--timeout", "20", check=False)
    assert (proc.returncode, proc.stdout) == (1, "") and time.monotonic() - started < 15, proc
    assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.endswith("(in preempted/); it will never run: not waited for\n"), proc.stderr
    err = gq.work / "wait.err"
    waiting = in_background(gq, err, "wait", str(running), str(damaged), "--timeout", "60")
    try:
        wait_for(lambda: said in err.read_text(), 10, what="wait's word on the damaged file")
        assert waiting.poll() is None  # still waiting: the running job will end
        (gq.work / "go").write_text("")
        out, _ = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1 and gq.state_of(running) == "done" and out == ""
    assert err.read_text().count(said) == 1


def test_wait_says_a_damaged_pending_file_was_rejected(gq: Env) -> None:
    """A job whose file in pending/ is damaged, rejected by the worker while `wait` waited for it:
    wait said "#2 gone: gone". It says it was rejected, why, and where its file and reason are."""
    gq.script("hold.py", WAIT_FOR_GO)
    running, damaged = gq.add("hold.py"), gq.add("true")  # one slot: the second waits behind the first
    live_worker(gq)
    gq.wait_state(running, "running")
    gq.gpuq("stop")  # so that wait says, once it has read the queue, that nothing more will start
    err = gq.work / "wait.err"
    waiting = in_background(gq, err, "wait", str(running), str(damaged), "--timeout", "60")
    try:
        wait_for(lambda: NO_WORKER in err.read_text(), 10, what="wait to have read the queue")
        name = gq.files("pending")[0]
        (gq.home / "pending" / name).write_text(f'{{"schema_version": 1, "id": {damaged}, "na')
        live_worker(gq)
        wait_for(lambda: gq.files("rejected") == [name, f"{name}.reason"], 15, what="the worker to reject it")
        (gq.work / "go").write_text("")
        out, _ = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 1 and gq.state_of(running) == "done", (out, err.read_text())
    assert out.startswith(f"#{damaged} rejected: not valid JSON") and "gone" not in out, out
    assert out.endswith(f"(its file is rejected/{name}: `gpuq rejected`)\n"), out


def test_wait_on_a_damaged_running_file_waits_only_while_its_supervisor_lives(gq: Env) -> None:
    """A damaged file in running/ that no supervisor holds can never be ended (no look can read it):
    `wait` waited for it until --timeout, or for ever. While its supervisor lives it is waited for
    (the supervisor records the end from the job it holds); once it is gone wait says so at once."""
    gq.script("hold.py", WAIT_FOR_GO)
    job_id = gq.add("hold.py")
    live_worker(gq)
    job = wait_for(lambda: gq.state_of(job_id) == "running" and gq.job(job_id).get("supervisor") and gq.job(job_id))
    name = gq.files("running")[0]
    (gq.home / "running" / name).write_text(f'{{"schema_version": 1, "id": {job_id}, "na')
    try:
        held = gq.gpuq("wait", str(job_id), "--timeout", "1", check=False)
        assert (held.returncode, held.stdout) == (1, f"#{job_id} running: still waiting when --timeout ran out\n")
        assert held.stderr == "", held.stderr
        os.kill(job["supervisor"]["pid"], signal.SIGKILL)
        wait_for(lambda: not alive(job["supervisor"]["pid"]), 10, what="the supervisor gone")
        started = time.monotonic()
        proc = gq.gpuq("wait", str(job_id), "--timeout", "20", check=False)
        assert (proc.returncode, proc.stdout) == (1, "") and time.monotonic() - started < 15, proc
        said = f"gpuq wait: job #{job_id}: file is damaged: not valid JSON"
        assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.endswith("(in running/); no supervisor holds it to record its end: not waited for\n")
    finally:
        (gq.work / "go").write_text("")  # its process, which no one can find from its file now, exits
    wait_for(lambda: not alive(job["pid"]), 10, what="the job's process to exit")


def test_wait_on_a_damaged_finished_file_says_its_end_cannot_be_read(gq: Env) -> None:
    """A damaged file in failed/ or cancelled/: wait said "it will never run", though the job ran (or
    was cancelled). It says its end cannot be read."""
    failed = gq.add("--", "false")
    gq.gpuq("run")
    cancelled = gq.add("--hold", "true")
    gq.gpuq("cancel", str(cancelled))
    for state, job_id in (("failed", failed), ("cancelled", cancelled)):
        (name,) = gq.files(state)
        (gq.home / state / name).write_text(f'{{"schema_version": 1, "id": {job_id}, "na')
    proc = gq.gpuq("wait", str(failed), str(cancelled), check=False)
    assert (proc.returncode, proc.stdout) == (1, ""), proc
    lines = proc.stderr.splitlines()
    assert [line.split(": file is damaged: ")[0] for line in lines] == [
        f"gpuq wait: job #{failed}",
        f"gpuq wait: job #{cancelled}",
    ]
    assert lines[0].endswith("(in failed/); its end cannot be read") and "never run" not in proc.stderr, lines
    assert lines[1].endswith("(in cancelled/); its end cannot be read"), lines
