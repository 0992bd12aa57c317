"""Never start over (issue 13): a recovered, retried or automatically retried job continues from
the newest complete checkpoint it wrote itself; not from one cut short, not from a stale one of an
earlier run in the same output directory. Real workers, real jobs (tests/fake_trainer.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from conftest import Env, wait_for

FAKE = Path(__file__).with_name("fake_trainer.py")


def trainer(gq: Env, *args: str, opts: tuple = ()) -> int:
    shutil.copy(FAKE, gq.work / "fake_trainer.py")
    return gq.add(*opts, "-p", sys.executable, "fake_trainer.py", "--output_dir", "out", *args)


def runs(gq: Env) -> list[str]:
    path = gq.work / "out" / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


def stale_checkpoint(gq: Env, step: int) -> Path:
    """A complete checkpoint an earlier run left an hour ago in the same output directory."""
    path = gq.work / "out" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    old = time.time() - 3600
    for item in (path / "trainer_state.json", path):
        os.utime(item, (old, old))
    return path


def printed_step(gq: Env, job_id: int) -> int:
    steps = [int(line.split()[1].split("/")[0]) for line in gq.log(job_id).splitlines() if line.startswith("Step ")]
    return steps[-1] if steps else 0


def kill_job_and_supervisor(gq: Env, job_id: int) -> None:
    """What a reboot does to a running job: it and its supervisor die without a word."""
    job = gq.job(job_id)
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)


def test_recover_after_a_reboot_continues_from_its_newest_complete_checkpoint(gq: Env) -> None:
    stale_checkpoint(gq, 90)
    job_id = trainer(gq, "--max_steps", "60", "--partial_save_at", "35", "--step_time", "0.1")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("supervisor") and printed_step(gq, job_id) >= 37, 30, what="step 37")
    # the "reboot" comes at once: stopped here, the job cannot reach checkpoint-40 while the worker
    # is being stopped on a loaded machine
    os.killpg(gq.job(job_id)["pid"], signal.SIGSTOP)
    worker.send_signal(signal.SIGTERM)
    worker.wait(10)
    kill_job_and_supervisor(gq, job_id)
    wait_for(lambda: gq.gpuq("status") and gq.state_of(job_id) == "interrupted", 15, what="the next look to settle it")

    listed = gq.gpuq("recover").stdout  # says what it will do before it acts
    assert f"#{job_id} work/fake_trainer: continues from checkpoint-30 (lost" in listed
    lost = gq.job(job_id)["history"][-1]
    done = gq.gpuq("recover", "--all").stdout
    assert "continues from checkpoint-30" in done
    job = gq.job(job_id)
    assert job["resumed_from"] == str(gq.work / "out" / "checkpoint-30") and job["lost_steps"] >= 7
    assert job["cmd"][-2:] == ["--resume_from_checkpoint", job["resumed_from"]]
    assert lost["outcome"] == "interrupted"
    gq.gpuq("run")
    assert gq.wait_state(job_id, "done")
    assert runs(gq)[-1] == "30 60"  # continued at 30, not 35 (cut short), not 90 (an earlier run's)
    assert "Resumed from step 30" in gq.log(job_id)
    history = gq.job(job_id)["history"]
    assert history[-1]["resumed_from"].endswith("checkpoint-30") and history[-1]["lost_steps"] >= 7
    assert json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)["resumed_from"].endswith("checkpoint-30")


def test_retry_of_a_crashed_job_continues_and_from_scratch_does_not(gq: Env) -> None:
    job_id = trainer(gq, "--max_steps", "40", "--fail_at", "25", "--fail_once")
    gq.gpuq("run")
    assert gq.wait_state(job_id, "failed")["exit_code"] == 1
    out = gq.gpuq("retry", str(job_id)).stdout
    assert "continues from checkpoint-20 (lost 5 steps)" in out
    gq.gpuq("run")
    gq.wait_state(job_id, "done")
    assert runs(gq) == ["0 25 crashed", "20 40"]

    gq.gpuq("retry", "--from-scratch", str(job_id), check=False)  # done: not retryable
    other = trainer(gq, "--max_steps", "30", "--fail_at", "15", "--fail_once", "--output_dir", "out2")
    gq.gpuq("run")
    gq.wait_state(other, "failed")
    assert "starts over, as asked (lost 15 steps)" in gq.gpuq("retry", "--from-scratch", str(other)).stdout
    assert "--resume_from_checkpoint" not in gq.job(other)["cmd"]
    gq.gpuq("run")
    gq.wait_state(other, "done")
    assert (gq.work / "out2" / "runs.txt").read_text().splitlines() == ["0 15 crashed", "0 30"]


def test_an_automatic_retry_continues_from_the_checkpoint(gq: Env) -> None:
    job_id = trainer(gq, "--max_steps", "40", "--fail_at", "27", "--fail_once", opts=("--retries", "1"))
    gq.gpuq("run")
    job = gq.wait_state(job_id, "done")
    assert runs(gq) == ["0 27 crashed", "20 40"]
    assert job["history"][0]["outcome"] == "pending" and job["history"][1]["resumed_from"].endswith("checkpoint-20")
    assert job["history"][1]["lost_steps"] == 7


def test_a_job_that_always_fails_from_its_checkpoint_stops_after_its_retries(gq: Env) -> None:
    job_id = trainer(gq, "--max_steps", "40", "--fail_at", "25", opts=("--retries", "2"))
    gq.gpuq("run")
    job = gq.wait_state(job_id, "failed")
    assert runs(gq) == ["0 25 crashed", "20 25 crashed", "20 25 crashed"]
    assert (
        job["note"] == "failed 3 times, the last 2 from checkpoint-20; its --retries (2) are used up: not retried again"
    )
    assert "not retried again" in gq.gpuq("status").stdout


def test_no_resume_always_starts_over(gq: Env) -> None:
    job_id = trainer(gq, "--max_steps", "30", "--fail_at", "25", "--fail_once", opts=("--no-resume", "--retries", "1"))
    gq.gpuq("run")
    gq.wait_state(job_id, "done")
    assert runs(gq) == ["0 25 crashed", "0 30"]
    assert "--resume_from_checkpoint" not in gq.job(job_id)["cmd"]


def test_a_preempted_job_never_resumes_from_an_earlier_runs_checkpoint(gq: Env) -> None:
    """The case from the issue: a stale checkpoint-50 of an earlier run, the job preempted at step
    28 with its own checkpoints 10 and 20: resume must use checkpoint-20."""
    stale_checkpoint(gq, 50)
    job_id = trainer(gq, "--max_steps", "60", "--step_time", "0.1")
    gq.start_worker("--watch")
    wait_for(lambda: printed_step(gq, job_id) >= 28, 30, what="step 28")
    gq.gpuq("preempt", str(job_id))
    record = gq.wait_state(job_id, "preempted")["preemptions"][-1]
    # a loaded machine may let it go on some steps past 28 before the preemption lands: any of its
    # own checkpoints, never the stale one of step 50 beyond its last step
    assert record["last_step"] < 50, "preempted after it wrote a checkpoint-50 of its own: the case is lost"
    step = record["checkpoint_step"]
    assert 20 <= step <= record["last_step"] and record["checkpoint"].endswith(f"/checkpoint-{step}")
    assert record["lost_steps"] == record["last_step"] - record["checkpoint_step"]
    gq.gpuq("resume", str(job_id))
    gq.wait_state(job_id, "done")
    assert runs(gq)[-1] == f"{record['checkpoint_step']} 60"


def test_run_recover_picks_interrupted_jobs_up_by_itself(gq: Env) -> None:
    job_id = trainer(gq, "--max_steps", "40", "--step_time", "0.05")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("supervisor") and printed_step(gq, job_id) >= 23, 30, what="step 23")
    worker.send_signal(signal.SIGTERM)
    worker.wait(10)
    kill_job_and_supervisor(gq, job_id)  # the machine "reboots": job and supervisor gone
    gq.start_worker("--watch", "--recover")
    gq.wait_state(job_id, "done", timeout=30)
    assert runs(gq)[-1] == "20 40"
    assert f"recovered job #{job_id}" in gq.worker_output(1) and "continues from checkpoint-20" in gq.worker_output(1)


# A --ckpt-glob job that saved step_10, then began two saves and died before writing either: an
# empty directory (an empty folder under it) and an empty file match the glob too.
SAVES_BEGUN = """import os, sys
os.makedirs("ckpts/step_10")
with open("ckpts/step_10/w.bin", "wb") as fh:
    fh.write(b"w" * 1000)
print("Step 10/40", flush=True)
os.makedirs("ckpts/step_20/shards")
open("ckpts/step_30", "wb").close()
print("saving step 20...", flush=True)
sys.exit(1)
"""


def test_a_save_begun_but_not_written_is_no_checkpoint(gq: Env) -> None:
    gq.script("train.py", SAVES_BEGUN)
    job_id = gq.add("-p", sys.executable, "--ckpt-glob", "ckpts/step_*", "--resume-arg", "--ckpt {ckpt}", "train.py")
    gq.gpuq("run")
    gq.wait_state(job_id, "failed")
    step_10 = gq.work / "ckpts" / "step_10"
    assert f"{step_10} (step 10)" in gq.gpuq("triage", str(job_id)).stdout
    assert "continues from step_10" in gq.gpuq("retry", str(job_id)).stdout
    assert gq.job(job_id)["cmd"][-2:] == ["--ckpt", str(step_10)]
