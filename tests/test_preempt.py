"""Preempt, resume and urgent jobs: pure functions first, then real workers running
tests/fake_trainer.py (real processes, real checkpoint directories)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import alive, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.core import resume_arg, schema
from gpuq.core.job import Job
from gpuq.core.times import duration, parse_iso
from gpuq.core.transitions import Continuation
from gpuq.engine.schedule import scheduler
from gpuq.engine.tracking import checkpoints, progress

FAKE = Path(__file__).with_name("fake_trainer.py")


# ---- checkpoints ----------------------------------------------------------------------------
def hf_ckpt(out: Path, step: int, complete: bool = True) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text("w")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_hf_checkpoints_newest_complete_by_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hf_ckpt(out, 9)
    hf_ckpt(out, 100)
    hf_ckpt(out, 20)
    hf_ckpt(out, 150, complete=False)  # died while saving
    jit = hf_ckpt(out, 140)
    (jit / "checkpoint-is-incomplete.txt").write_text("in progress")  # HF 5 JIT save cut short
    (out / "checkpoint-200").write_text("a file, not a directory")
    job = Job({"cmd": ["python", "train.py", "--output_dir", "out"], "cwd": str(tmp_path)})
    found = checkpoints.latest_checkpoint(job)
    assert found == checkpoints.Checkpoint(str(out / "checkpoint-100"), 100)
    job["cmd"] = ["python", "train.py", "--output-dir=out"]
    assert checkpoints.latest_checkpoint(job).step == 100
    assert checkpoints.latest_checkpoint(Job({"cmd": ["python", "train.py"], "cwd": str(tmp_path)})) is None


def test_glob_checkpoints_by_step_then_epoch_then_mtime(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    for name in ("epoch=1-step=900.ckpt", "epoch=3-step=1200.ckpt", "epoch=10-step=300.ckpt"):
        (d / name).write_text("x")
    job = Job({"cmd": ["python", "t.py"], "cwd": str(tmp_path), "ckpt_glob": "ckpts/*.ckpt"})
    assert checkpoints.latest_checkpoint(job).path.endswith("epoch=3-step=1200.ckpt")
    assert checkpoints.latest_checkpoint(job).step == 1200
    for n in (2, 10, 5):
        (d / f"model_epoch_{n}.pt").write_text("x")
    (d / "model_epoch_99.pt").write_text("")  # empty: cut short, skipped
    job["ckpt_glob"] = "ckpts/model_epoch_*.pt"
    assert checkpoints.latest_checkpoint(job) == checkpoints.Checkpoint(str(d / "model_epoch_10.pt"), None, 10)
    (d / "last.ckpt").write_text("x")
    (d / "best.ckpt").write_text("x")
    os.utime(d / "best.ckpt", (time.time() - 100, time.time() - 100))
    os.utime(d / "last.ckpt", (time.time() + 5, time.time() + 5))
    job["ckpt_glob"] = str(d / "*.ckpt")  # absolute; some names have no number: newest by mtime
    assert checkpoints.latest_checkpoint(job).path == str(d / "last.ckpt")


def test_a_glob_checkpoint_named_by_a_trailing_number_tells_its_step(tmp_path: Path) -> None:
    d = tmp_path / "out"
    d.mkdir()
    for name, age in (("ck-12", 100), ("ck-8", 0), ("w_0004.pt", 50)):  # mtimes against the steps
        (d / name).write_text("x")
        os.utime(d / name, (time.time() - age, time.time() - age))
    job = Job({"cmd": ["python", "t.py"], "cwd": str(tmp_path), "ckpt_glob": "out/*"})
    assert [(os.path.basename(c.path), c.step) for c in checkpoints.candidates(job)] == [
        ("w_0004.pt", 4),
        ("ck-8", 8),
        ("ck-12", 12),
    ]
    assert checkpoints.name_step("model_epoch_3.pt") is None  # an epoch's number is no step
    assert checkpoints.name_step("last.ckpt") is None
    # a checkpoint whose name tells no step: what the interruption cost is unknown, not every step
    assert Continuation(str(d / "last.ckpt"), None, 10).lost is None
    assert Continuation(str(d / "ck-8"), 8, 10).lost == 2 and Continuation(None, None, 10).lost == 10


def test_argv_helpers() -> None:
    cmd = ["python", "t.py", "--max_steps", "300", "--output_dir=o", "--max-steps=400"]
    assert checkpoints.max_steps(cmd) == 400  # the last one wins, as with argparse
    assert checkpoints.max_steps(["t.py", "--max_steps", "-1"]) is None
    assert checkpoints.max_steps(["t.py", "--max_steps", "x"]) is None
    assert checkpoints.output_dir(cmd, "/w") == "/w/o"
    assert checkpoints.output_dir(["t.py", "--output_dir", "/abs"], "/w") == "/abs"


# ---- resume argv ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cmd",
    [
        ["py", "t.py", "--resume_from_checkpoint", "/old", "--lr", "1"],
        ["py", "t.py", "--resume_from_checkpoint=/old", "--lr", "1"],
        ["py", "t.py", "--resume_from_checkpoint=/a", "--lr", "1", "--resume_from_checkpoint", "/b"],
        ["py", "t.py", "--lr", "1"],
    ],
)
def test_resume_argv_replaces_both_forms(cmd: list[str]) -> None:
    new = resume_arg.resume_argv(cmd, resume_arg.DEFAULT_RESUME_ARG, "/ck/checkpoint-5")
    assert new == ["py", "t.py", "--lr", "1", "--resume_from_checkpoint", "/ck/checkpoint-5"]
    assert resume_arg.resume_argv(new, resume_arg.DEFAULT_RESUME_ARG, "/ck/checkpoint-9").count("/ck/checkpoint-9") == 1


def test_resume_argv_other_templates() -> None:
    cmd = ["py", "t.py", "ckpt_path=/old.ckpt", "trainer.max_epochs=3"]
    assert resume_arg.resume_argv(cmd, "ckpt_path={ckpt}", "/n.ckpt") == [
        "py",
        "t.py",
        "trainer.max_epochs=3",
        "ckpt_path=/n.ckpt",
    ]
    assert resume_arg.resume_argv(["py", "t.py", "--ckpt", "a"], "--ckpt={ckpt}", "b") == ["py", "t.py", "--ckpt=b"]
    assert resume_arg.check_resume_arg("--ckpt") is not None
    assert resume_arg.check_resume_arg("'unclosed {ckpt}") is not None
    assert resume_arg.check_resume_arg("--ckpt {ckpt}") is None


def test_last_step_in_log_formats() -> None:
    assert progress.last_step(b"Step 3/10\nStep 4/10\nloss 1\n") == 4
    assert progress.last_step(b"\r 40%|####  | 8/20 [00:01<00:02, 5it/s]\r 45%| 9/20 [00:02<00:02]") == 9
    assert progress.last_step(b"epoch 100%\nnothing here") is None
    assert progress.last_step(b"Step 12/10") is None  # not a progress figure


# ---- scheduler --------------------------------------------------------------------------------
def job(job_id: int, **fields: object) -> dict:
    return Job(schema.new_job(job_id=job_id, name=f"j{job_id}", cmd=["x"], cwd="/", log=""), **fields)


def test_queue_order_urgent_then_resumed_then_priority() -> None:
    pending = [job(1), job(2, priority=5), job(3, queue_front=True), job(4, urgent=True), job(5, priority=5)]
    assert [j["id"] for j in scheduler.queue_order(pending)] == [4, 3, 2, 5, 1]


def test_preemption_victims_lowest_priority_latest_started() -> None:
    running = [
        job(1, pid=11, priority=0, started_at="2026-01-01T10:00:00+00:00"),
        job(2, pid=12, priority=0, started_at="2026-01-01T11:00:00+00:00"),
        job(3, pid=13, priority=-1, started_at="2026-01-01T09:00:00+00:00"),
        job(4, pid=14, urgent=True),
    ]
    snap = scheduler.QueueState(states={j["id"]: "running" for j in running}, running=running)
    snap.pending = [job(9, urgent=True)]
    snap.states[9] = "pending"

    def victims(free: list, preempting: set, continues=lambda j: "from its checkpoint") -> list[int]:
        return [v["id"] for v in scheduler.preemption_victims(snap, free, [None], preempting, continues)[0]]

    assert victims([], set()) == [3]
    running[2]["priority"] = 1
    assert victims([], set()) == [2]
    assert victims([], {2}) == []  # one is already being preempted
    assert victims([None], set()) == []  # a slot is free
    # Only a job that can continue is preempted: the next in line, else none (the urgent job waits)...
    assert victims([], set(), lambda j: j["id"] == 1 or None) == [1]
    chosen, unserved = scheduler.preemption_victims(snap, [], [None], set(), lambda j: None)
    assert chosen == [] and [j["id"] for j in unserved] == [9]
    snap.pending = [job(9, urgent="force")]  # ...unless it was queued with --urgent=force
    assert victims([], set(), lambda j: j["id"] == 1 or None) == [1]
    assert victims([], set(), lambda j: None) == [2]
    snap.pending = [job(9, urgent=True, after=[4])]  # not ready yet: preempt nothing
    assert victims([], set()) == []


def test_urgent_is_true_false_or_force_in_a_job_file() -> None:
    assert schema.validate(job(1, urgent="force"))["urgent"] == "force"
    with pytest.raises(schema.InvalidJob, match='true, false or "force"'):
        schema.validate(job(1, urgent="yes"))


def test_how_a_victim_would_continue(tmp_path: Path) -> None:
    from gpuq.engine.schedule import victims

    out = tmp_path / "out"
    running = job(1, pid=11, cmd=["python", "train.py", "--output_dir", str(out)], cwd=str(tmp_path))
    assert victims.how_it_continues(running) is None  # no checkpoint: it would start over
    assert "--preemptible" in victims.how_it_continues(Job(running, preemptible=True))
    hf_ckpt(out, 40)
    assert victims.how_it_continues(running) == "from checkpoint-40"
    assert victims.how_it_continues(Job(running, no_resume=True)) is None


def test_dependent_of_preempted_job_waits_with_a_reason() -> None:
    wait = scheduler.waiting_reason(job(2, after=[1]), {1: "preempted", 2: "pending"})
    assert wait is not None and "gpuq resume 1" in wait.reason
    assert scheduler.waiting_reason(job(2, after=[1]), {1: "pending", 2: "pending"}).forever is False


# ---- real workers -----------------------------------------------------------------------------
def setup_trainer(gq) -> None:
    shutil.copy(FAKE, gq.work / "fake_trainer.py")


def add_trainer(gq, *args: str, gpuq_opts: tuple = ()) -> int:
    return gq.add(*gpuq_opts, "-p", sys.executable, "fake_trainer.py", *args)


def state_of(gq, job_id: int) -> object:
    """The job's state, or None while it is between two states (a move writes the new file
    before removing the old one, so a poll can see both for an instant)."""
    found = [
        s
        for s in ("pending", "running", "done", "failed", "preempted", "interrupted", "cancelled")
        if any(n.startswith(f"{job_id:06d}-") for n in gq.files(s))
    ]
    return found[0] if len(found) == 1 else None


def wait_state(gq, job_id: int, state: str, timeout: float = 15) -> dict:
    wait_for(lambda: state_of(gq, job_id) == state, timeout, what=f"job {job_id} to be {state}")
    return gq.job(job_id)


def last_step(gq, job_id: int) -> int:
    """The last step the job's current attempt printed."""
    steps = re.findall(r"Step (\d+)/", gq.log(job_id).rsplit("=== gpuq: job #", 1)[-1])
    return int(steps[-1]) if steps else 0


def shown(gq, job_id: int) -> dict[str, str]:
    """`gpuq show`'s lines, label -> text."""
    lines = gq.gpuq("show", str(job_id)).stdout.splitlines()[1:]
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in lines if re.search(r"\S\s{2,}\S", line))


def runs(out: Path) -> list[tuple[int, int]]:
    path = out / "runs.txt"
    return [tuple(map(int, line.split())) for line in path.read_text().split("\n") if line] if path.exists() else []


@pytest.mark.parametrize("graceful", [False, True])
def test_preempt_records_checkpoint_and_lost_steps_then_resume_finishes(gq, graceful: bool) -> None:
    setup_trainer(gq)
    extra = ["--save_on_sigterm"] if graceful else []
    # --retries: a preempted job is neither done (exit 0) nor failed and retried (exit 143)
    jid = add_trainer(
        gq, "--output_dir", "out", "--max_steps", "60", "--save_steps", "10", *extra, gpuq_opts=("--retries", "2")
    )
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 13, 20, what="step 13")
    proc = gq.gpuq("preempt", str(jid))
    job = wait_state(gq, jid, "preempted")
    record = job["preemptions"][-1]
    out = gq.work / "out"
    if graceful:
        assert job["exit_code"] == 0
        assert record["lost_steps"] == 0 and record["checkpoint_step"] == record["last_step"] >= 13
    else:
        assert job["exit_code"] == 143 and job["signal"] == "SIGTERM"
        # the newest complete one (a kill between printing step 20 and saving it leaves checkpoint-10)
        assert record["checkpoint_step"] in ((record["last_step"] // 10) * 10, (record["last_step"] // 10) * 10 - 10)
        assert record["lost_steps"] == record["last_step"] - record["checkpoint_step"]
        assert f"lost {record['lost_steps']} step" in proc.stdout  # "1 step", "2 steps"
    assert record["checkpoint"] == job["checkpoint"] == str(out / f"checkpoint-{record['checkpoint_step']}")
    assert "waiting up to 60s" in proc.stdout and record["checkpoint"] in proc.stdout
    assert not (gq.home / "control" / f"{jid:06d}.json").exists()
    assert shown(gq, jid)["checkpoint"] == record["checkpoint"]  # where `resume` would continue

    res = gq.gpuq("resume", str(jid))
    assert record["checkpoint"] in res.stdout
    job = wait_state(gq, jid, "done", timeout=30)
    assert job["resumed_from"] == record["checkpoint"] and job["resumed_from_step"] == record["checkpoint_step"]
    # the preemption's checkpoint is past (checkpoint-60 is the newest now): show says what it resumed
    # from, and no longer names it as the job's checkpoint
    card = shown(gq, jid)
    assert "checkpoint" not in card and card["last attempt resumed from"].startswith(record["checkpoint"]), card
    assert runs(out)[-1] == (record["checkpoint_step"], 60)  # started at the checkpoint, reached max_steps
    row = next(r for r in gq.status_json() if r["id"] == jid)
    assert row["resumed_from"] == record["checkpoint"] and row["preemptions"][-1]["lost_steps"] is not None


def test_timeout_without_force_leaves_job_running_then_force_kills(gq) -> None:
    setup_trainer(gq)
    jid = add_trainer(gq, "--output_dir", "out", "--max_steps", "100000", "--ignore_sigterm")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 3, 20, what="step 3")
    proc = gq.gpuq("preempt", str(jid), "--timeout", "1", check=False)
    assert proc.returncode == 1 and "it will be recorded preempted when it exits" in proc.stdout
    job = gq.job(jid)
    assert job["state"] == "running" and alive(job["pid"])
    assert (gq.home / "control" / f"{jid:06d}.json").exists()  # SIGTERM was sent: the request stays
    before = last_step(gq, jid)
    wait_for(lambda: last_step(gq, jid) > before + 2, 10, what="training to go on")

    proc = gq.gpuq("preempt", str(jid), "--timeout", "1", "--force")
    assert "SIGKILL" in proc.stdout
    job = wait_state(gq, jid, "preempted")
    assert job["exit_code"] == 137 and not alive(job["pid"])


SLOW_SAVE = r"""
import os, signal, sys, time
def stop(*_):
    print("saving...", flush=True)
    while not os.path.exists("saved"):  # the test says when the save is over
        time.sleep(0.05)
    sys.exit(0 if os.path.exists("finish") else 143)
signal.signal(signal.SIGTERM, stop)
print("Step 1/3\nStep 2/3\nStep 3/3" if os.path.exists("finish") else "Step 1/60", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("finish", [False, True])
def test_a_job_still_saving_at_the_timeout_ends_preempted_when_it_exits(gq, finish: bool) -> None:
    """SIGTERM sent, the request stays past --timeout: the job that exits from it is preempted, not
    failed and retried at once on the GPU the preemption meant to free; one whose progress reached
    its end and exits 0 is done."""
    gq.script("slow_save.py", SLOW_SAVE)
    if finish:
        gq.script("finish", "")
    jid = gq.add("--retries", "1", "-p", sys.executable, "slow_save.py")
    gq.start_worker("--watch")
    wait_for(lambda: "Step " in gq.log(jid), 20, what="the job to start")
    proc = gq.gpuq("preempt", str(jid), "--timeout", "0.5", check=False)
    assert proc.returncode == 1 and "still saving; it will be recorded preempted when it exits" in proc.stdout
    wait_for(lambda: "saving..." in gq.log(jid), 10, what="the job to save")
    row = next(r for r in gq.status_json() if r["id"] == jid)
    assert row["state"] == "running" and row["stopping"]["action"] == "preempt"
    gq.script("saved", "")
    job = wait_state(gq, jid, "done" if finish else "preempted")
    assert job["attempts"] == 1 and job["exit_code"] == (0 if finish else 143)
    assert not (gq.home / "control" / f"{jid:06d}.json").exists()
    gq.gpuq("stop")


def test_child_ignoring_sigterm_holds_the_slot_until_killed(gq) -> None:
    setup_trainer(gq)
    jid = add_trainer(gq, "--output_dir", "out", "--max_steps", "100000", "--child_ignoring_sigterm")
    other = add_trainer(gq, "--output_dir", "out2", "--max_steps", "1")
    gq.start_worker("--watch")
    pidfile = gq.work / "out" / "child.pid"
    wait_for(lambda: last_step(gq, jid) >= 3 and pidfile.exists(), 20, what="step 3 and the child")
    child = int(pidfile.read_text())
    try:
        proc = gq.gpuq("preempt", str(jid), "--timeout", "1", check=False)
        assert proc.returncode == 1 and str(child) in proc.stdout and "ignore SIGTERM" in proc.stdout
        # The main process is gone, the child still holds "the GPU": nothing else may start.
        assert alive(child) and state_of(gq, jid) == "running" and state_of(gq, other) == "pending"
        gq.gpuq("preempt", str(jid), "--timeout", "1", "--force")
        assert gq.job(jid)["state"] == "preempted" and not alive(child)
        wait_state(gq, other, "done", timeout=20)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_resume_replaces_flag_twice_and_never_duplicates(gq) -> None:
    setup_trainer(gq)
    start = hf_ckpt(gq.work / "out", 4)  # the job is added resuming from it, in the `=` form
    jid = add_trainer(gq, "--output_dir", "out", "--max_steps", "100000", f"--resume_from_checkpoint={start}")
    gq.start_worker("--watch")
    for _round in range(2):
        base = gq.job(jid)["resumed_from_step"] or 4
        wait_for(lambda b=base: last_step(gq, jid) >= b + 12, 20, what="progress past the next save")
        gq.gpuq("preempt", str(jid))
        wait_state(gq, jid, "preempted")
        gq.gpuq("resume", str(jid))
        again = gq.gpuq("resume", str(jid), check=False)
        assert again.returncode == 1 and "already" in again.stderr
        cmd = gq.job(jid)["cmd"]
        flags = [w for w in cmd if w.startswith("--resume_from_checkpoint")]
        assert flags == ["--resume_from_checkpoint"], cmd
        assert cmd[cmd.index("--resume_from_checkpoint") + 1] == gq.job(jid)["resumed_from"]
        wait_for(lambda: state_of(gq, jid) == "running" and last_step(gq, jid) > 0, 20, what="running again")
    ids = [r["id"] for r in gq.status_json()]
    assert sorted(ids) == sorted(set(ids)) and len([i for i in ids if i == jid]) == 1
    starts = [int(m) for m in re.findall(r"Resumed from step (\d+)", gq.log(jid))]
    assert starts[0] == 4 and starts[1] >= 10 and starts[2] > starts[1]
    killed = gq.gpuq("kill", str(jid), check=False)  # it would run 100000 steps
    assert killed.returncode == 0, (killed.stderr, gq.job(jid), gq.log(jid)[-3000:], gq.worker_output())


def test_dependent_of_preempted_job_runs_only_after_continuation(gq) -> None:
    setup_trainer(gq)
    a = add_trainer(gq, "--output_dir", "out", "--max_steps", "40", "--save_steps", "5")
    b = gq.add("--after", str(a), "-p", sys.executable, "fake_trainer.py", "--output_dir", "b", "--max_steps", "1")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, a) >= 8, 20, what="step 8")
    gq.gpuq("preempt", str(a))
    wait_state(gq, a, "preempted")
    row = next(r for r in gq.status_json() if r["id"] == b)
    assert row["state"] == "pending" and f"gpuq resume {a}" in row["waiting"]
    status = gq.gpuq("status").stdout
    assert f"gpuq resume {a}" in status
    gq.gpuq("resume", str(a))
    done_b = wait_state(gq, b, "done", timeout=30)
    done_a = gq.job(a)
    assert done_a["state"] == "done" and runs(gq.work / "out")[-1][1] == 40
    assert parse_iso(done_b["started_at"]) >= parse_iso(done_a["finished_at"])


def test_urgent_job_preempts_runs_first_then_victim_resumes_ahead_of_queue(gq) -> None:
    setup_trainer(gq)
    low = add_trainer(
        gq,
        *("--output_dir", "low", "--max_steps", "60", "--save_on_sigterm"),
        gpuq_opts=("--priority", "-1", "--preemptible"),
    )
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, low) >= 5, 20, what="the training to run")
    later = add_trainer(gq, "--output_dir", "later", "--max_steps", "2", gpuq_opts=("--priority", "5"))
    urgent = add_trainer(gq, "--output_dir", "urgent", "--max_steps", "3", gpuq_opts=("--urgent",))
    wait_state(gq, urgent, "done", timeout=30)
    wait_state(gq, later, "done", timeout=60)
    low_job = wait_state(gq, low, "done", timeout=60)
    record = low_job["preemptions"][-1]
    assert record["by"] == "urgent job" and record["lost_steps"] == 0
    first_run, second_run = runs(gq.work / "low")
    assert second_run == (first_run[1], 60)  # resumed where the graceful save left it
    # order: urgent before the resumed training, the resumed training before the rest of the queue
    start = {j: parse_iso(gq.job(j)["started_at"]) for j in (low, later, urgent)}
    assert parse_iso(gq.job(urgent)["finished_at"]) <= start[low] <= start[later]
    assert f"preempting job #{low}" in gq.worker_output()


def test_urgent_add_says_a_no_resume_job_with_checkpoints_does_not_resume(gq) -> None:
    """A running --no-resume job would start over though it wrote checkpoints (and is --preemptible):
    `add --urgent` said it "has no checkpoint and is not --preemptible"; it says it does not resume."""
    Gpus(gq, fake_gpus(1))
    setup_trainer(gq)
    opts = ("--no-resume", "--preemptible")
    low = add_trainer(gq, "--output_dir", "low", "--max_steps", "100000", "--save_steps", "2", gpuq_opts=opts)
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "low" / "checkpoint-2" / "trainer_state.json").exists(), 20, what="a checkpoint")
    added = gq.gpuq("add", "--urgent", "--", "true").stdout
    assert f"(#{low} work/fake_trainer does not resume (--no-resume)), so it waits" in added, added
    gq.gpuq("cancel", added.split("#", 1)[1].split(":", 1)[0])
    forced = gq.gpuq("add", "--urgent=force", "--", "true").stdout
    assert f"job #{low} work/fake_trainer is preempted" in forced, forced
    assert "it starts over (--no-resume: --urgent=force)" in forced, forced


def test_a_no_resume_job_preempted_is_recorded_as_starting_over_with_all_its_steps_lost(gq) -> None:
    """An --urgent=force job preempting a --no-resume job with checkpoints: its record named the
    newest checkpoint and "lost 2 steps", as if it would continue from it, though it starts over;
    it says so, and counts the steps lost from its start."""
    setup_trainer(gq)
    opts = ("--no-resume",)
    low = add_trainer(gq, "--output_dir", "low", "--max_steps", "100000", "--save_steps", "5", gpuq_opts=opts)
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "low" / "checkpoint-5" / "trainer_state.json").exists(), 20, what="a checkpoint")
    wait_for(lambda: last_step(gq, low) >= 7, 20, what="steps past the checkpoint")
    urgent = gq.add("--urgent=force", "--", "true")
    wait_state(gq, urgent, "done", timeout=30)
    record = wait_for(lambda: (gq.job(low)["preemptions"] or [None])[-1], 20, what="the preemption's record")
    said = f"preempted by urgent job; starts over (--no-resume): lost {record['last_step']} steps, all since its start"
    card = shown(gq, low)["preemptions"]
    assert said in card and "checkpoint" not in card, card
    assert said in gq.gpuq("history", str(low)).stdout
    assert record["starts_over"] is True and record["lost_steps"] == record["last_step"] >= 7, record


def test_urgent_job_waits_beside_a_job_that_would_start_over_unless_forced(gq) -> None:
    """A running job without a checkpoint (and not --preemptible) would lose its whole run: an
    urgent job waits for a free slot instead, and `add` says so; --urgent=force takes it anyway."""
    setup_trainer(gq)
    low = add_trainer(gq, "--output_dir", "low", "--max_steps", "100000", "--save_steps", "100000")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, low) >= 3, 20, what="the training to run")
    trainer = ("-p", sys.executable, "fake_trainer.py", "--max_steps", "3", "--output_dir")
    added = gq.gpuq("add", "--urgent", *trainer, "u1")
    assert f"#{low} " in added.stdout and "waits for a free slot" in added.stdout, added.stdout
    waiting = int(added.stdout.split("#", 1)[1].split(":", 1)[0])

    def reason() -> str:
        row = next(r for r in gq.status_json() if r["id"] == waiting)
        return row["state"] == "pending" and row.get("waiting") or ""

    assert "without losing its progress" in wait_for(reason, 15, what="the urgent job's reason to wait")
    assert state_of(gq, low) == "running" and not (gq.home / "control" / f"{low:06d}.json").exists()
    forced = gq.gpuq("add", "--urgent=force", *trainer, "u2")
    assert f"job #{low} " in forced.stdout and "starts over" in forced.stdout, forced.stdout
    wait_state(gq, waiting + 1, "done", timeout=40)  # both urgent jobs ran, then the preempted one resumed
    assert gq.job(waiting)["state"] == "done"
    record = wait_state(gq, low, "running", timeout=20)["preemptions"][-1]
    assert record["by"] == "urgent job" and record["checkpoint"] is None
    assert "it will start over" in gq.worker_output()


def test_priorities_order_the_queue(gq) -> None:
    setup_trainer(gq)
    ids = [
        add_trainer(gq, "--output_dir", f"o{p}", "--max_steps", "1", gpuq_opts=("--priority", str(p)))
        for p in (0, 5, -2, 5, 1)
    ]
    status = gq.gpuq("status").stdout
    assert "prio=5" in status and "prio=-2" in status
    gq.start_worker()
    for jid in ids:
        wait_state(gq, jid, "done", timeout=30)
    started = sorted(ids, key=lambda j: parse_iso(gq.job(j)["started_at"]))
    assert started == [ids[1], ids[3], ids[4], ids[0], ids[2]]


def test_no_checkpoint_and_require_checkpoint(gq) -> None:
    setup_trainer(gq)
    jid = add_trainer(gq, "--output_dir", "out", "--max_steps", "100000", "--save_steps", "100000")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 3, 20, what="step 3")
    out = gq.gpuq("preempt", str(jid)).stdout
    assert "no complete checkpoint found" in out
    assert f"`gpuq resume {jid}` starts it over from scratch: it left no complete checkpoint" in out, out
    assert "continues" not in out
    refused = gq.gpuq("resume", str(jid), "--require-checkpoint", check=False)
    assert refused.returncode == 1 and "no complete checkpoint" in refused.stderr
    assert state_of(gq, jid) == "preempted"
    res = gq.gpuq("resume", str(jid))
    assert "no checkpoint found" in res.stdout
    wait_for(lambda: gq.log(jid).count("Starting from scratch") == 2, 20, what="a restart from scratch")
    gq.gpuq("kill", str(jid))  # it would run 100000 steps


def test_ckpt_glob_and_resume_arg(gq) -> None:
    setup_trainer(gq)
    jid = add_trainer(
        gq,
        "--output_dir",
        "out",
        "--style",
        "epoch",
        "--max_steps",
        "30",
        "--save_steps",
        "4",
        "--step_time",
        "0.2",  # 6 s in all: the preempt after step 10 lands before the end on a loaded machine too
        gpuq_opts=("--ckpt-glob", "out/ckpts/model_epoch_*.pt", "--resume-arg", "ckpt_path={ckpt}"),
    )
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 10, 20, what="step 10")
    out = gq.gpuq("preempt", str(jid)).stdout
    job = wait_state(gq, jid, "preempted")
    ckpt = job["checkpoint"]
    assert re.search(r"model_epoch_(\d+)\.pt$", ckpt)
    assert f"`gpuq resume {jid}` continues it from {ckpt}" in out, out
    gq.gpuq("resume", str(jid))
    job = wait_state(gq, jid, "done", timeout=30)
    assert f"ckpt_path={ckpt}" in job["cmd"]
    assert runs(gq.work / "out")[-1] == (int(re.search(r"(\d+)\.pt$", ckpt).group(1)), 30)


# Saves out/ck-N when asked to stop at step N; a resumed run has nothing left to do.
SAVES_ON_SIGTERM = """import os, signal, sys, time
if "--resume" in sys.argv:
    sys.exit(0)
step = 0
def save(*_):
    os.makedirs(f"out/ck-{step}")
    open(f"out/ck-{step}/w", "w").write("x")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
while True:
    step += 1
    print(f"Step {step}/1000", flush=True)
    time.sleep(0.05)
"""


def test_a_ckpt_glob_checkpoint_named_ck_n_resumes_having_lost_no_step(gq) -> None:
    gq.script("ck.py", SAVES_ON_SIGTERM)
    jid = gq.add("--ckpt-glob", "out/ck-*", "--resume-arg", "--resume {ckpt}", "-p", sys.executable, "ck.py")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 3, 20, what="step 3")
    gq.gpuq("preempt", str(jid))
    job = wait_state(gq, jid, "preempted")
    step = int(job["checkpoint"].rsplit("-", 1)[1])
    assert job["preemptions"][-1]["checkpoint_step"] == step and job["preemptions"][-1]["lost_steps"] == 0
    gq.gpuq("resume", str(jid))
    job = gq.job(jid)
    assert job["resumed_from_step"] == step and job["lost_steps"] == 0
    wait_state(gq, jid, "done")


def test_bad_command_lines(gq) -> None:
    setup_trainer(gq)
    for args in (["preempt", "abc"], ["preempt", "1", "--timeout", "-1"], ["resume"]):
        proc = gq.gpuq(*args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    proc = gq.gpuq("add", "--resume-arg=--ckpt", "fake_trainer.py", check=False)
    assert proc.returncode == 2 and "{ckpt}" in proc.stderr and not gq.files("pending")
    for args in (["preempt", "42"], ["resume", "42"]):
        proc = gq.gpuq(*args, check=False)
        assert proc.returncode == 1 and "no such job #42" in proc.stderr
    jid = add_trainer(gq, "--max_steps", "1")
    proc = gq.gpuq("preempt", str(jid), check=False)
    assert proc.returncode == 1 and "pending, not running" in proc.stderr


def test_show_of_a_job_preempted_twice_says_where_its_last_attempt_resumed_from(gq) -> None:
    setup_trainer(gq)
    jid = add_trainer(gq, "--output_dir", "out", "--max_steps", "100000", "--save_on_sigterm")
    gq.start_worker("--watch")
    wait_for(lambda: last_step(gq, jid) >= 3, 20, what="step 3")
    gq.gpuq("preempt", str(jid))
    first = wait_state(gq, jid, "preempted")["checkpoint"]
    gq.gpuq("resume", str(jid))
    wait_for(lambda: state_of(gq, jid) == "running" and last_step(gq, jid) >= 3, 20, what="the resumed attempt")
    assert re.search(rf"\n  resumed from +{re.escape(first)} ", gq.gpuq("show", str(jid)).stdout)
    gq.gpuq("preempt", str(jid))
    second = wait_state(gq, jid, "preempted")["checkpoint"]
    assert second != first
    shown = gq.gpuq("show", str(jid)).stdout
    assert re.search(rf"\n  checkpoint +{re.escape(second)}\n", shown)
    assert re.search(rf"\n  last attempt resumed from +{re.escape(first)} ", shown) and "resumes from" not in shown
    assert f"resumes from {second}" in gq.gpuq("resume", str(jid)).stdout
    # It would run 100000 steps; kill refuses a job the worker has not started yet.
    wait_for(lambda: state_of(gq, jid) == "running", 20, what="the third attempt")
    gq.gpuq("kill", str(jid))


# A job that saves (until the test writes `go`) once told to stop, as a trainer saves its checkpoint.
SAVES_UNTIL_GO = """import os, signal, sys, time
def save_and_exit(*_):
    open("termed", "w").close()
    while not os.path.exists("go"):
        time.sleep(0.02)
    sys.exit(0)
signal.signal(signal.SIGTERM, save_and_exit)
open("started", "w").close()
while True:
    time.sleep(0.02)
"""


@pytest.mark.parametrize(
    "command, shown, ends", [("preempt", "preempting", "preempted"), ("kill", "stopping", "cancelled")]
)
def test_a_job_being_preempted_or_killed_says_so_until_it_has_ended(gq, command: str, shown: str, ends: str) -> None:
    gq.script("saves.py", SAVES_UNTIL_GO)
    jid = gq.add("--gpus", "0", "saves.py")
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "started").exists() and gq.job(jid).get("pid"), 20, what="the job to run")
    row = lambda: next(r for r in gq.status_json() if r["id"] == jid)  # noqa: E731
    assert row()["stopping"] is None
    asked = subprocess.Popen(
        [sys.executable, "-m", "gpuq", command, str(jid)], cwd=gq.work, env=gq.env, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: (gq.work / "termed").exists(), 15, what="the job to be told to stop")
        stopping = row()["stopping"]
        assert stopping["action"] == command
        assert parse_iso(gq.job(jid)["started_at"]) <= parse_iso(stopping["since"]) <= time.time()
        (line,) = [line for line in gq.gpuq("status").stdout.splitlines() if line.split()[:1] == [str(jid)]]
        assert f"  {shown} since " in line and "pid=" in line, line
        assert f"  state      running: {shown} since " in gq.gpuq("show", str(jid)).stdout
    finally:
        (gq.work / "go").write_text("")
        asked.communicate(timeout=30)
    assert asked.returncode == 0
    assert (row()["state"], row()["stopping"]) == (ends, None)


def test_show_of_a_resumed_job_gives_the_wait_before_its_first_start(gq) -> None:
    """A resumed job's `started` line counted its first run as time in the queue (`after 1m04s in
    the queue` for a job that waited 34 s before it first ran); it now says when it first started
    and the wait before that."""
    gq.script("wait.py", "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n")
    jid = gq.add("wait.py")
    gq.start_worker("--watch")
    wait_state(gq, jid, "running")
    gq.gpuq("preempt", str(jid))
    wait_state(gq, jid, "preempted")
    gq.gpuq("resume", str(jid))
    job = wait_state(gq, jid, "running")
    first, created = job["history"][0]["started_at"], job["created_at"]
    assert first != job["started_at"]
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(parse_iso(first)))
    wait = duration(parse_iso(first) - parse_iso(created))
    (line,) = [line for line in gq.gpuq("show", str(jid)).stdout.splitlines() if line.split()[:1] == ["started"]]
    assert line.endswith(f" (first started {clock}, after {wait} in the queue)"), line
    (gq.work / "go").touch()
    wait_state(gq, jid, "done")


def test_urgent_job_with_a_free_gpu_is_told_it_starts_now(gq) -> None:
    """A free GPU beside a running job that cannot be preempted: `add --urgent` says the urgent job
    starts now, not that it waits for a free slot."""
    Gpus(gq, fake_gpus(2))
    low = gq.add("--", sys.executable, "-c", "import time; time.sleep(60)")
    gq.start_worker("--watch")
    gq.wait_state(low, "running", timeout=20)
    added = gq.gpuq("add", "--urgent", "--", sys.executable, "-c", "print(1)").stdout
    assert "urgent: first in line, and a slot it fits is free: it starts now" in added, added
    assert "waits for a free slot" not in added, added
    gq.gpuq("kill", str(low))
