"""What a tester's hour as a new user found (2026-12-06), each on the real CLI with real workers:
`add` accepting values its own job files refuse, `edit` making two jobs wait for each other, a
stray note in pending/ said to be "taken in", sizes and numbers read silently, a message that says
"try again" where trying again never helps."""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus


@pytest.mark.parametrize(
    "args,said",
    [
        (("--gpus", "1025"), "--gpus must be from 0 to 1024"),
        (("--retries", "101"), "--retries must be from 0 to 100"),
        (("--retry-oom", "1000"), "--retry-oom must be from 0 to 100"),
        (("--min-free", "5"), "--min-free: '5' has no unit: did you mean 5G? (write 5B for bytes)"),
        (("--max-log-size", "5"), "--max-log-size: '5' has no unit: did you mean 5G? (write 5B for bytes)"),
        (("--max-log-size", "-5"), "--max-log-size: '-5' is not a positive size"),  # not "did you mean -5G?"
        (("--min-free", "0"), "--min-free: '0' is not a positive size"),
    ],
)
def test_add_refuses_what_its_job_file_could_not_hold(gq: Env, args: tuple[str, ...], said: str) -> None:
    """Before: `--gpus 1025` printed "[+] Job #1" and the worker then moved the file to rejected/;
    `--retries 101` queued a job no `edit` could change; `--min-free 5` meant 5 bytes."""
    gq.script("t.py", "")
    for line in (("add", *args, "t.py"), ("add", "--dry-run", *args, "t.py")):
        proc = gq.gpuq(*line, check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"gpuq add: {said}\n"), line
    assert gq.files("pending") == gq.files("rejected") == []
    run = gq.gpuq("run", "--max-log-size", "5", check=False)
    assert run.returncode == 2 and "'5' has no unit" in run.stderr
    job = gq.add("--min-free", "4096B", "--max-log-size", "1G", "--retries", "100", "--gpus", "0", "t.py")
    assert (gq.job(job)["min_free_bytes"], gq.job(job)["max_log_bytes"]) == (4096, 1 << 30)


def test_edit_refuses_a_loop_of_jobs_waiting_for_each_other(gq: Env) -> None:
    """Before: `edit 1 --set after=2` on a job that #2 waits for was taken; neither ever started
    and `gpuq run` waited for them forever."""
    first = gq.add("--hold", "--", "true")
    second = gq.add("--after", str(first), "--", "true")
    third = gq.add("--after", str(second), "--", "true")
    for key in ("after", "after_any"):
        proc = gq.gpuq("edit", str(first), "--set", f"{key}=[{third}]", check=False)
        assert proc.returncode == 2 and proc.stdout == ""  # a bad value: a bad command line, as for every edit
        assert proc.stderr == (
            f"gpuq edit: job #{first} not changed: it would wait for itself "
            f"(#{first} after #{third} after #{second} after #{first}), and none of them would start\n"
        )
        assert gq.job(first)["after"] == [] and gq.job(first)["after_any"] == []
    fourth = gq.add("--", "true")  # waiting for a job outside the loop is fine
    gq.gpuq("edit", str(first), "--set", f"after={fourth}")
    assert gq.job(first)["after"] == [fourth]


def test_a_file_in_pending_that_is_no_json_is_said_to_be_left_alone(gq: Env) -> None:
    """spool_layout.md, section 3: other names are never touched; `status` said they would be taken in."""
    worker = gq.start_worker("--watch")
    wait_for(lambda: (gq.home / "pending").is_dir(), what="the spool, made by the worker")
    (gq.home / "pending" / "notes.txt").write_text("x\n")
    (gq.home / "pending" / "job.json").write_text(json.dumps({"cmd": ["true"]}))
    wait_for(lambda: gq.files("done"), timeout=20, what="the dropped job, run")
    out = gq.gpuq("status").stdout
    assert "warning: pending/notes.txt: not taken in (only *.json files are jobs); left alone\n" in out
    assert "not taken in yet" not in out
    assert (gq.home / "pending" / "notes.txt").read_text() == "x\n" and gq.files("rejected") == []
    assert worker.poll() is None


def test_release_or_retry_of_a_running_job_says_where_it_is(gq: Env) -> None:
    """Before: "job #1 is busy (running: being started or changed); try again", for as long as it ran."""
    gq.script("wait.py", WAIT_FOR_GO)
    gq.start_worker("--watch")
    job = gq.add("wait.py")
    gq.wait_state(job, "running")
    for command, states in (("release", "held"), ("retry", "failed or cancelled")):
        proc = gq.gpuq(command, str(job), check=False)
        assert (proc.returncode, proc.stderr) == (1, f"gpuq: job #{job} is running, not {states}\n"), command
    (gq.work / "go").touch()
    gq.wait_state(job, "done")


def test_retry_of_an_interrupted_or_preempted_job_names_the_command_that_does_it(gq: Env) -> None:
    """Before: "job #1 is interrupted, not failed or cancelled", and nothing on what to type."""
    gq.script("wait.py", WAIT_FOR_GO)
    gq.start_worker("--watch")
    cut, stopped = gq.add("wait.py"), gq.add("wait.py")
    job = wait_for(lambda: (j := gq.job(cut)).get("pid") and j.get("supervisor") and j, 20, what="pid recorded")
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)  # the machine went down
    gq.wait_state(cut, "interrupted", 20)
    wait_for(lambda: gq.job(stopped).get("pid"), 20, what="the second job running")
    gq.gpuq("preempt", str(stopped))
    gq.wait_state(stopped, "preempted", 20)
    for job_id, how in (
        (cut, f"`gpuq recover --jobs {cut}` or `gpuq resume {cut}`"),
        (stopped, f"`gpuq resume {stopped}`"),
    ):
        proc = gq.gpuq("retry", str(job_id), check=False)
        state = gq.job(job_id)["state"]
        said = f"gpuq: job #{job_id} is {state}, not failed or cancelled: {how} puts it back in the queue\n"
        assert (proc.returncode, proc.stderr) == (1, said)
    (gq.work / "go").touch()


def test_a_command_that_cannot_run_is_refused_at_add(gq: Env) -> None:
    """Before: queued, then "exit=127 could not start: Permission denied"."""
    (gq.work / "notexec.sh").write_text("echo hi\n")
    for word, said in (
        (
            "./notexec.sh",
            f"not executable: {gq.work}/./notexec.sh (`chmod +x ./notexec.sh`, or queue `bash ./notexec.sh`)",
        ),
        ("/tmp", "a directory, not a program: /tmp"),
    ):
        proc = gq.gpuq("add", word, check=False)
        assert (proc.returncode, proc.stderr) == (2, f"gpuq add: {said}\n")
    os.chmod(gq.work / "notexec.sh", 0o755)
    assert gq.add("./notexec.sh") and len(gq.files("pending")) == 1


@pytest.mark.parametrize(
    "line,said",
    [
        (("add", "--after-any", "99", "true"), "gpuq: --after-any: no such job #99"),
        (("wait", "abc"), "gpuq wait: argument ID: cannot read 'abc' as a job id or range"),
        (("log", "1", "-n", "-5"), "gpuq log: argument -n/--lines: not a number of lines (0 or more): '-5'"),
        (("wait", "--timeout", "-1"), "gpuq wait: argument --timeout: not a number of seconds (0 or more): '-1'"),
        (("preempt", "1", "--timeout", "nan"), "gpuq preempt: argument --timeout: not a number of seconds"),
        (("top", "--interval", "nan"), "gpuq top: argument --interval: not a number of seconds from 0.1 to 3600"),
        (
            ("service", "install", "--web", "--web-port", "0"),
            "gpuq service: --web-port: the service needs a fixed port",
        ),
    ],
)
def test_a_bad_number_or_id_is_named_as_given(gq: Env, line: tuple[str, ...], said: str) -> None:
    proc = gq.gpuq(*line, check=False)
    assert proc.returncode in (1, 2) and proc.stdout == "" and proc.stderr.startswith(said), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_a_damaged_held_job_is_a_row_of_status(gq: Env) -> None:
    """Before: a held (or preempted, interrupted) job file that no longer parsed was left out of
    `status` and `status -a`, while `release` and `cancel` refused it as damaged."""
    job = gq.add("--hold", "--", "true")
    (name,) = gq.files("held")
    (gq.home / "held" / name).write_text("{not json")
    out = gq.gpuq("status").stdout
    row = next(line for line in out.splitlines() if line.lstrip().startswith(f"{job} "))
    assert "unreadable job file: not valid JSON" in row, out


def test_show_of_an_ended_job_says_which_gpu_it_last_held(gq: Env) -> None:
    """`show` said a finished job "holds GPU 0" (status --json's `gpus` is where it ran)."""
    Gpus(gq, fake_gpus(1))
    gq.script("wait.py", WAIT_FOR_GO)
    gq.start_worker("--watch")
    job = gq.add("wait.py")
    gq.wait_state(job, "running")
    assert "1 GPU; holds GPU 0" in gq.gpuq("show", str(job)).stdout
    (gq.work / "go").touch()
    gq.wait_state(job, "done")
    shown = gq.gpuq("show", str(job)).stdout
    assert "1 GPU; last held GPU 0" in shown and "holds GPU" not in shown
