"""A job whose supervisor died while the job ran out of GPU memory is sent back with the larger share
as its supervisor would have sent it: by the worker's repair while a retry is left, else by `gpuq
recover`. Real processes: the supervisor is SIGKILLed, then the job prints PyTorch's CUDA
out-of-memory error and exits, with nobody to record it."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from conftest import Env, alive, wait_for
from test_gpu_worker import Gpus, fake_gpus, row
from test_oom import G

# Its first attempt waits for `die`, then dies of CUDA out-of-memory; a retry after one runs to the end.
OOM_WHEN_TOLD = """import json, os, sys, time
k = os.environ.get("GPUQ_OOM_RETRY")
with open(f"attempt-{k or 0}.json", "w") as fh:
    json.dump({"retry": k, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}, fh)
if k is None:
    while not os.path.exists("die"):
        time.sleep(0.02)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
          "capacity of 79.10 GiB of which 1.2 GiB is free.", flush=True)
    sys.exit(1)
print("trained with", os.environ.get("GPUQ_OOM_RETRY"))
"""


def _attempt(gq: Env, k: int) -> dict[str, Any]:
    path = gq.work / f"attempt-{k}.json"
    return json.loads(wait_for(lambda: path.exists() and path.read_text(), 20, what=f"attempt {k}"))


def _kill_supervisor_then_oom(gq: Env, job_id: int) -> dict[str, Any]:
    """The first attempt running; its supervisor SIGKILLed; then the job runs out of memory and exits."""
    _attempt(gq, 0)
    job = wait_for(lambda: gq.job(job_id).get("supervisor") and gq.job(job_id), 20, what="the supervisor recorded")
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(job["supervisor"]["pid"]), 10, what="the supervisor gone")
    (gq.work / "die").write_text("")
    wait_for(lambda: not alive(job["pid"]), 10, what="the job's process gone")
    return job


def test_the_workers_repair_retries_it_with_the_share_doubled(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("train.py", OOM_WHEN_TOLD)
    job_id = gq.add("--gpu-mem", "20G", "--retry-oom", "1", "train.py")
    gq.start_worker("--watch")
    _kill_supervisor_then_oom(gq, job_id)
    assert _attempt(gq, 1) == {"retry": "1", "gpus": "0"}
    done = gq.wait_state(job_id, "done", timeout=20)
    assert done["gpu_mem_mib"] == 40 * G and done["oom_retries"] == 1 and done["attempts"] == 2
    first = done["history"][0]
    assert first["outcome"] == "pending" and first["gpu_mem_mib"] == 20 * G and first["exit_code"] is None
    assert first["reason"].startswith("CUDA out of memory (tried to allocate 2.00 GiB)")
    assert first["change"] == "retrying after out-of-memory with 40G"
    assert "trained with 1" in gq.log(job_id)


def test_without_a_retry_left_it_is_interrupted_and_recover_gives_it_more(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("train.py", OOM_WHEN_TOLD)
    job_id = gq.add("--gpu-mem", "20G", "train.py")
    worker = gq.start_worker("--watch")
    _attempt(gq, 0)
    wait_for(lambda: gq.job(job_id).get("supervisor"), 20, what="the supervisor recorded")
    worker.kill()  # the worker too: only `gpuq recover` brings the job back
    worker.wait()
    _kill_supervisor_then_oom(gq, job_id)
    shown = row(gq, job_id)  # looking settles it
    assert shown["state"] == "interrupted" and shown["gpu_mem_mib"] == 20 * G
    assert "its log shows CUDA out of memory" in shown["note"] and "runs it again with 40G" in shown["note"]
    said = gq.gpuq("recover", "--all").stdout
    assert "retrying after out-of-memory with 40G" in said and "Re-queued 1 job." in said
    job = gq.job(job_id)
    assert job["state"] == "pending" and job["gpu_mem_mib"] == 40 * G and job["oom_retries"] == 1
    assert job["history"][-1]["change"] == "retrying after out-of-memory with 40G"
    assert job["history"][-1]["reason"].startswith("CUDA out of memory")
    gq.gpuq("run", timeout=60)
    assert _attempt(gq, 1) == {"retry": "1", "gpus": "0"}
    assert gq.wait_state(job_id, "done")["gpu_mem_mib"] == 40 * G


def test_an_interruption_without_out_of_memory_is_recovered_with_the_same_share(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("train.py", OOM_WHEN_TOLD)
    job_id = gq.add("--gpu-mem", "20G", "--retry-oom", "1", "train.py")
    worker = gq.start_worker("--watch")
    _attempt(gq, 0)
    job = wait_for(lambda: gq.job(job_id).get("supervisor") and gq.job(job_id), 20, what="the supervisor recorded")
    worker.kill()
    worker.wait()
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)  # a reboot: no out-of-memory in its log
    wait_for(lambda: not alive(job["pid"]) and not alive(job["supervisor"]["pid"]), 10, what="both gone")
    assert row(gq, job_id)["state"] == "interrupted"
    gq.gpuq("recover", "--all")
    job = gq.job(job_id)
    assert job["gpu_mem_mib"] == 20 * G and job.get("oom_retries", 0) == 0
