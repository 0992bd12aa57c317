"""The disk guard, through a real worker: a job whose output's filesystem (a small tmpfs) has less
free space than its --min-free, or than twice its last checkpoint, waits saying why, and starts once
there is room (the tmpfs made larger, as a person would free space)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import Env, small_tmpfs, wait_for
from test_gpu_worker import row

from gpuq.core.job import Job
from gpuq.engine.schedule import diskguard

# Saves a checkpoint of 1.5 MiB; its first attempt then fails, the retry succeeds.
SAVES_THEN_FAILS_ONCE = """import json, os, sys
out = sys.argv[1]
step = len(os.listdir(out)) + 1 if os.path.isdir(out) else 1
d = os.path.join(out, f"checkpoint-{step}")
os.makedirs(d)
with open(os.path.join(d, "model.safetensors"), "wb") as fh:
    fh.write(b"w" * (3 << 19))
with open(os.path.join(d, "trainer_state.json"), "w") as fh:
    json.dump({"global_step": step}, fh)
sys.exit(1 if step == 1 else 0)
"""


def _grow(mount: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)


def short_of_8m(mount: Path) -> Path:
    """Leave about 4 MiB of a 16 MiB tmpfs free, as another program's file would: less than a
    --min-free 8M, which the filesystem could hold (a larger one is refused, or blocked for good)."""
    filler = mount / "filler"
    filler.write_bytes(b"\0" * (12 << 20))
    return filler


def test_a_job_waits_for_its_min_free_and_status_says_so(gq: Env, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "16m") as mount:
        filler = short_of_8m(mount)
        gq.script("job.py", "print('ran')\n")
        job_id = gq.add("--gpus", "0", "--min-free", "8M", "job.py", "--output_dir", str(mount / "out"))
        gq.start_worker("--watch")
        reason = wait_for(lambda: row(gq, job_id)["waiting"], 15, what="the guard's reason")
        assert reason.startswith(f"waiting for disk space: {mount} has ") and "(--min-free 8.0M)" in reason
        assert "waiting for disk space" in gq.gpuq("status").stdout
        assert "waiting for disk space" in gq.gpuq("show", str(job_id)).stdout
        assert gq.state_of(job_id) == "pending" and "ran" not in gq.log(job_id)
        filler.unlink()
        gq.wait_state(job_id, "done", timeout=20)


def test_a_job_the_guard_holds_has_no_start_time(gq: Env, tmp_path: Path) -> None:
    """Room comes when someone frees it, at a time no one can know: `status`, `eta`, `status --json`
    and `add --dry-run` give such a job no start time (they said `starts ~0s` while it kept
    waiting), nor one that waits for it; a job behind it starts."""
    with small_tmpfs(tmp_path, "16m") as mount:
        short_of_8m(mount)
        gq.script("job.py", "print('ran')\n")
        guarded = ("--gpus", "0", "--min-free", "8M", "job.py", "--output_dir", str(mount / "out"))
        held = gq.add(*guarded)
        after = gq.add("--gpus", "0", "--after", str(held), "job.py")
        behind = gq.add("--gpus", "0", "job.py")
        gq.start_worker("--watch")
        gq.wait_state(behind, "done", timeout=20)
        rows = {r["id"]: r for r in gq.status_json()}
        assert rows[held]["waiting"].startswith("waiting for disk space: ")
        assert rows[held]["starts_in_seconds"] is None and rows[after]["starts_in_seconds"] is None
        said = gq.gpuq("eta", str(held)).stdout
        assert f"(pending): start unknown: waiting for disk space: {mount} has " in said, said
        assert "starts ~" not in gq.gpuq("status").stdout
        (dry,) = json.loads(gq.gpuq("add", "--dry-run", "--json", *guarded).stdout)["jobs"]
        assert dry["would_start"]["why_not"].startswith("waiting for disk space: "), dry["would_start"]
        assert dry["would_start"]["starts_in_seconds"] is None
        assert gq.state_of(held) == "pending"


def test_a_retry_waits_for_twice_its_last_checkpoint(gq: Env, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "4m") as mount:
        gq.script("train.py", SAVES_THEN_FAILS_ONCE)
        job_id = gq.add(
            "--gpus", "0", "--retries", "1", "train.py", str(mount / "out"), "--output_dir", str(mount / "out")
        )
        gq.start_worker("--watch")
        reason = wait_for(lambda: gq.state_of(job_id) == "pending" and row(gq, job_id)["waiting"], 20, what="the wait")
        assert "twice its last checkpoint, 1.5M" in reason
        job = gq.job(job_id)
        assert job["attempts"] == 1 and job["ckpt_bytes"] >= 3 << 19
        _grow(mount, "16m")
        gq.wait_state(job_id, "done", timeout=20)


def test_a_job_with_nothing_to_measure_is_not_held(tmp_path: Path) -> None:
    job = Job(cmd=["train"], cwd=str(tmp_path))
    assert diskguard.wait(job) is None
    held = Job(cmd=["train"], cwd=str(tmp_path), min_free_bytes=1 << 60)  # more than any disk
    wait = diskguard.wait(held)
    assert wait is not None and wait.forever and str(tmp_path) in wait.reason


def test_a_min_free_above_the_filesystem_s_size_is_refused_or_blocked_for_good(gq: Env, tmp_path: Path) -> None:
    """`add --min-free 1T` on a smaller filesystem waited for ever ("start unknown", nothing to fix):
    add and edit refuse it as they refuse a --gpu-mem no GPU has; one queued before waits blocked,
    and triage offers a --min-free that fits."""
    with small_tmpfs(tmp_path, "16m") as mount:
        gq.script("job.py", "print('ran')\n")
        out = ("job.py", "--output_dir", str(mount / "out"))
        refused = gq.gpuq("add", "--gpus", "0", "--min-free", "20M", *out, check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"needs 20.0M free disk space (--min-free); {mount} is on a filesystem of 16.0M" in refused.stderr
        assert "could never start" in refused.stderr and gq.status_json() == []
        job_id = gq.add("--hold", "--gpus", "0", "--min-free", "8M", *out)
        refused = gq.gpuq("edit", str(job_id), "--set", "min_free=1T", check=False)
        assert refused.returncode == 2 and f"job #{job_id} not changed: needs 1024.0G free disk space" in refused.stderr
        assert "could never start" in refused.stderr and gq.job(job_id)["min_free_bytes"] == 8 << 20
        _grow(mount, "4m")  # the filesystem shrank under a queued job
        gq.gpuq("release", str(job_id))
        gq.start_worker("--watch")
        reason = wait_for(lambda: row(gq, job_id)["waiting"], 15, what="the guard's reason")
        assert reason.startswith("needs 8.0M free disk space (--min-free)"), reason
        assert "blocked: needs 8.0M" in gq.gpuq("status").stdout
        triage = gq.gpuq("triage", str(job_id)).stdout
        assert f"gpuq edit {job_id} --set min_free=" in triage and "nothing to fix" not in triage, triage
        gq.gpuq("edit", str(job_id), "--set", "min_free=2M")
        gq.wait_state(job_id, "done", timeout=20)
