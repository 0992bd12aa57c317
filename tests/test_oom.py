"""Out-of-memory retries with more room, through a real worker on simulated GPUs (GPUQ_FAKE_GPUS):
the job's script prints PyTorch's CUDA out-of-memory error on its first attempt, as a real one
would, and the retry must come with a larger share and GPUQ_OOM_RETRY set."""

from __future__ import annotations

import json
from typing import Any

from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus, row

from gpuq.core import oom
from gpuq.core.job import Job

G = 1024  # MiB

# Dies of CUDA out-of-memory unless it is a retry after one; records what each attempt saw.
OOM_ONCE = """import json, os, sys
k = os.environ.get("GPUQ_OOM_RETRY")
seen = {"retry": k, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(f"attempt-{k or 0}.json", "w") as fh:
    json.dump(seen, fh)
if int(k or 0) < int(sys.argv[1]):
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
          "capacity of 79.10 GiB of which 1.2 GiB is free.", flush=True)
    sys.exit(1)
while not os.path.exists("go"):
    import time
    time.sleep(0.02)
"""


def _add(gq: Env, *options: str, fails: int = 1) -> int:
    gq.script("oom.py", OOM_ONCE)
    return gq.add(*options, "oom.py", str(fails))


def _attempt(gq: Env, k: int) -> dict[str, Any]:
    path = gq.work / f"attempt-{k}.json"
    return json.loads(wait_for(lambda: path.exists() and path.read_text(), 20, what=f"attempt {k}"))


def test_a_20g_job_that_runs_out_of_memory_is_retried_with_40g_and_ends_done(gq: Env) -> None:
    """--gpu-mem 20G --retries 1: the out-of-memory attempt goes back with 40G and GPUQ_OOM_RETRY=1;
    while 40G does not fit (a process not gpuq's holds 50G of the one GPU) status says it retries
    after out-of-memory with 40G; once it fits, it runs and ends done; show and history say, per
    attempt, what it had and why it changed."""
    gpus = Gpus(gq, fake_gpus(1, total=80 * G, foreign={0: (4242, 50 * G)}))
    job_id = _add(gq, "--gpu-mem", "20G", "--retries", "1")
    gq.start_worker("--watch")
    assert _attempt(gq, 0)["retry"] is None
    job = wait_for(lambda: gq.job(job_id).get("oom_retries") == 1 and gq.job(job_id), 20, what="the OOM retry")
    assert job["gpu_mem_mib"] == 40 * G and job["attempts"] == 1
    assert job["history"][0]["gpu_mem_mib"] == 20 * G
    assert job["history"][0]["reason"].startswith("CUDA out of memory (tried to allocate 2.00 GiB)")
    assert "retrying after out-of-memory with 40G" in job["history"][0]["change"]
    wait_for(lambda: "waiting for GPU 0" in (row(gq, job_id)["waiting"] or ""), 20, what="it to wait for 40G")
    assert "retrying after out-of-memory with 40G" in gq.gpuq("status").stdout
    gpus.set(fake_gpus(1, total=80 * G))
    second = _attempt(gq, 1)
    assert second == {"retry": "1", "gpus": "0"}
    (gq.work / "go").write_text("")
    done = gq.wait_state(job_id, "done", timeout=20)
    assert done["gpu_mem_mib"] == 40 * G and done["attempts"] == 2
    shown = gq.gpuq("show", str(job_id)).stdout
    assert "failed, retried (exit 1)" in shown and "had 20G of a GPU (GPU 0)" in shown
    assert "retrying after out-of-memory with 40G" in shown and "had 40G of a GPU" in shown
    history = gq.gpuq("history", str(job_id)).stdout
    assert "had 20G of a GPU" in history and "CUDA out of memory" in history and "had 40G of a GPU" in history
    assert "out of memory: the next attempt gets 40G (GPUQ_OOM_RETRY=1)" in gq.log(job_id)


def test_a_whole_gpu_job_is_retried_on_the_gpu_with_the_most_memory(gq: Env) -> None:
    """A whole-GPU job placed on the first (small) GPU goes, after out-of-memory, to the larger one;
    --retry-oom alone pays for it (no --retries)."""
    doc = fake_gpus(2, total=40 * G)
    doc["gpus"][1]["memory_total_mib"] = 80 * G
    Gpus(gq, doc)
    job_id = _add(gq, "--retry-oom", "1")
    gq.start_worker("--watch")
    assert _attempt(gq, 0)["gpus"] == "0"
    assert _attempt(gq, 1) == {"retry": "1", "gpus": "1"}
    (gq.work / "go").write_text("")
    job = gq.wait_state(job_id, "done", timeout=20)
    assert job["gpu_largest"] is True and job["oom_retries"] == 1


def test_a_share_that_doubles_past_the_largest_gpu_becomes_a_whole_gpu(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    job_id = _add(gq, "--gpu-mem", "50G", "--retry-oom", "1")
    gq.start_worker("--watch")
    assert _attempt(gq, 1)["retry"] == "1"
    (gq.work / "go").write_text("")
    job = gq.wait_state(job_id, "done", timeout=20)
    assert job["gpu_mem_mib"] is None and "a whole GPU" in job["history"][0]["change"]


def test_without_retries_the_failure_says_what_a_retry_would_get(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    job_id = _add(gq, "--gpu-mem", "20G")
    gq.start_worker("--watch")
    job = gq.wait_state(job_id, "failed", timeout=20)
    assert job["reason"].startswith("CUDA out of memory")
    assert "it would have been retried with 40G" in job["reason"]
    assert job["gpu_mem_mib"] == 20 * G and job.get("oom_retries", 0) == 0


# Logs an out-of-memory it recovered from, then dies of something else.
RECOVERS_THEN_FAILS = """print("WARNING: OOM: Ran out of memory with exception: "
      "CUDA out of memory. Tried to allocate 1.50 GiB", flush=True)
print("WARNING: attempting to recover from OOM in forward/backward pass", flush=True)
raise ValueError("label 17 out of range for 10 classes")
"""


def test_an_oom_it_recovered_from_is_not_why_it_failed(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("fs.py", RECOVERS_THEN_FAILS)
    job_id = gq.add("--gpu-mem", "10G", "--retry-oom", "2", "fs.py")
    gq.start_worker("--watch")
    job = gq.wait_state(job_id, "failed", timeout=20)
    assert job["reason"] == "ValueError: label 17 out of range for 10 classes"
    assert job["attempts"] == 1 and job["gpu_mem_mib"] == 10 * G and job.get("oom_retries", 0) == 0


def test_retry_oom_is_refused_unless_a_count(gq: Env) -> None:
    gq.script("oom.py", OOM_ONCE)
    for bad in ("-1", "x"):
        proc = gq.gpuq("add", "--retry-oom", bad, "oom.py", check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# Grows to 150 MB (each step written, so resident), then ends; a first attempt holds it until the
# watch stops it, so that a watch slowed by a loaded machine still sees it.
GROWS = """import os, time
held = []
for _ in range(15):
    held.append(bytearray(b"x") * (10 << 20))
    time.sleep(0.02)
print("grown, retry", os.environ.get("GPUQ_OOM_RETRY"), flush=True)
if not os.environ.get("GPUQ_OOM_RETRY"):
    time.sleep(60)
"""


def test_a_job_past_its_mem_is_retried_with_it_doubled_up_to_the_workers_cap(gq: Env) -> None:
    """--mem 100M, held by the watch: the first attempt is stopped at 100M and goes back with 200M
    (the worker hands out 1G), which its 150 MB fit."""
    gq.env.update(GPUQ_HOST_LIMITS="watch", GPUQ_MEM_WATCH_SECONDS="0.2")
    gq.script("grows.py", GROWS)
    job_id = gq.add("--gpus", "0", "--mem", "100M", "--retry-oom", "1", "grows.py")
    gq.start_worker("--watch", "--kill-grace", "1", "--mem", "1G")
    job = gq.wait_state(job_id, "done", timeout=30)
    assert job["mem_mib"] == 200 and job["oom_retries"] == 1
    first = job["history"][0]
    assert first["mem_mib"] == 100 and first["reason"] == "host memory limit of 100M reached"
    assert first["change"] == "retrying after out-of-memory with 200M host memory"
    assert "grown, retry 1" in gq.log(job_id)


def test_the_larger_share_and_when_there_is_none() -> None:
    def grown(reason: Any, memory: Any = None, largest: Any = 80 * G, cap: Any = 64 * G, **fields: Any) -> Any:
        found = oom.grow(Job(cmd=["x"], cwd="/", **fields), reason, memory, largest, cap)
        return found and (found.changes, found.text)

    cuda = "CUDA out of memory (tried to allocate 2.00 GiB)"
    assert grown(cuda, gpu_mem_mib=20 * G) == ({"gpu_mem_mib": 40 * G}, "40G")
    assert grown(cuda, gpu_mem_mib=40 * G) == ({"gpu_mem_mib": None}, "a whole GPU")  # 80G is the whole GPU
    assert grown(cuda) == ({"gpu_largest": True}, "the GPU with the most memory (80G)")
    assert grown(cuda, gpu_request=0) is None  # a CPU job: no GPU to grow
    assert grown("ValueError: bad shape", gpu_mem_mib=20 * G) is None  # not out of memory
    assert grown(None, memory="16G", mem_mib=16 * G) == ({"mem_mib": 32 * G}, "32G host memory")
    assert grown(None, memory="48G", mem_mib=48 * G) == ({"mem_mib": 64 * G}, "64G host memory")  # the cap
    assert grown(None, memory="64G", mem_mib=64 * G) is None  # at the worker's cap: no more room
    assert grown(None, memory="16G", mem_mib=16 * G, cap=None) is None  # the cap unknown


def test_show_counts_the_out_of_memory_retries_since_a_person_s_retry_against_retry_oom(gq: Env) -> None:
    """After `gpuq retry`, which gives a fresh --retry-oom, show said `2 of 1 (--retry-oom 1)`: it
    counts those since against the allowance and says all of them beside."""
    Gpus(gq, fake_gpus(1, total=80 * G))
    job_id = _add(gq, "--gpu-mem", "20G", "--retry-oom", "1", fails=9)
    gq.start_worker("--watch")
    gq.wait_state(job_id, "failed", timeout=30)
    assert "out-of-memory retries  1 of 1 (--retry-oom 1)\n" in gq.gpuq("show", str(job_id)).stdout
    gq.gpuq("retry", str(job_id))
    wait_for(lambda: gq.state_of(job_id) == "failed" and gq.job(job_id)["oom_retries"] == 2, 30, what="2nd round")
    shown = gq.gpuq("show", str(job_id)).stdout
    assert "1 of 1 (--retry-oom 1) since it was last queued again by hand, 2 in all\n" in shown, shown
    assert "2 of 1" not in shown


def test_retry_oom_pays_for_its_own_attempts_only() -> None:
    grown, plain = {"change": "retrying after out-of-memory with 40G"}, {"change": None}
    job = Job(cmd=["x"], cwd="/", retries=1, retry_oom=2, attempts=3, history=[grown, grown])
    assert oom.retry_left(job)  # two of three attempts paid by --retry-oom: --retries 1 has one left
    assert not oom.retry_left(Job(cmd=["x"], cwd="/", retries=1, retry_oom=2, attempts=4, history=[grown] * 3))
    # a person's `gpuq retry` began a new round (attempts counted afresh): the earlier ones paid nothing
    assert not oom.retry_left(Job(cmd=["x"], cwd="/", retry_oom=1, attempts=2, history=[plain, grown]))
    assert oom.retry_left(Job(cmd=["x"], cwd="/", retry_oom=1, attempts=1, history=[plain, grown]))
