"""`gpuq status --json` says where a job's out-of-memory retries stand (the retry, the share it has
now, why it changed), its checkpoint rule and the disk guard's reason, with real workers on
simulated GPUs."""

from __future__ import annotations

from pathlib import Path

from conftest import WAIT_FOR_GO, Env, small_tmpfs, wait_for
from test_gpu_worker import Gpus, fake_gpus, row
from test_oom import G, _add, _attempt
from test_oom_diskguard import short_of_8m


def test_a_job_retrying_after_out_of_memory_says_its_retry_share_and_why(gq: Env) -> None:
    gpus = Gpus(gq, fake_gpus(1, total=80 * G, foreign={0: (4242, 50 * G)}))
    job_id = _add(gq, "--gpu-mem", "20G", "--retry-oom", "2", "--keep-checkpoints", "3")
    first = row(gq, job_id)
    assert first["oom_retry"] is None and first["retry_oom"] == 2 and first["keep_checkpoints"] == 3
    gq.start_worker("--watch")
    wait_for(lambda: "waiting for GPU 0" in (row(gq, job_id)["waiting"] or ""), 20, what="the 40G retry to wait")
    waiting = row(gq, job_id)
    assert waiting["state"] == "pending" and waiting["gpu_mem_mib"] == 40 * G
    retry = waiting["oom_retry"]
    assert retry["retry"] == 1 and retry["gpu_mem_mib"] == 40 * G and retry["gpu_largest"] is False
    assert retry["attempt"] == 1 and retry["reason"].startswith("CUDA out of memory (tried to allocate 2.00 GiB)")
    assert retry["change"].startswith("retrying after out-of-memory with 40G")
    gpus.set(fake_gpus(1, total=80 * G))
    _attempt(gq, 1)
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done", timeout=20)
    done = row(gq, job_id)  # a finished job keeps what its retries came to
    assert done["state"] == "done" and done["oom_retry"]["retry"] == 1 and done["oom_retry"]["gpu_mem_mib"] == 40 * G


def test_the_disk_guard_s_reason_is_given_also_where_another_wait_comes_first(gq: Env, tmp_path: Path) -> None:
    """A job after another, on a filesystem without its --min-free: `waiting` names the job it is
    after; `disk_wait` names the guard's reason all the same."""
    with small_tmpfs(tmp_path, "16m") as mount:
        short_of_8m(mount)
        gq.script("wait.py", WAIT_FOR_GO)
        first = gq.add("--gpus", "0", "wait.py")
        held = gq.add("--gpus", "0", "--after", str(first), "--min-free", "8M", "true", "--output_dir", str(mount))
        gq.start_worker("--watch")
        gq.wait_state(first, "running")
        shown = row(gq, held)
        assert f"#{first}" in shown["waiting"] and shown["min_free_bytes"] == 8 << 20
        assert shown["disk_wait"].startswith(f"waiting for disk space: {mount} has ")
        assert shown["disk_wait"].endswith("it needs 8.0M (--min-free 8.0M)")
        assert row(gq, first)["disk_wait"] is None
        (gq.work / "go").write_text("")
        gq.wait_state(first, "done")
        wait_for(lambda: (row(gq, held)["waiting"] or "").startswith("waiting for disk space"), 15, what="the guard")
