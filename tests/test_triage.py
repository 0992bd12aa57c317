"""`gpuq triage ID` (issue 30): why a job waits or failed, its log's end, its checkpoint, and the
gpuq command lines that would fix it. Real jobs run by a real worker; every fix offered is parsed
by gpuq's own parser, and one is run."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.cli import parse
from gpuq.core import failure, schema
from gpuq.core.errors import Refused
from gpuq.engine.views import fixes
from gpuq.engine.views.triage import MAX_LINE_CHARS, cause_of, triage
from gpuq.spool import Spool

# What PyTorch prints when the GPU runs out, then the exit a Python exception gives
OOM_SCRIPT = """import sys
print("step 3/100", flush=True)
sys.stderr.write('''Traceback (most recent call last):
  File "train.py", line 40, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB \
of which 1.50 GiB is free. Of the allocated memory 75.20 GiB is allocated by PyTorch.
''')
sys.exit(1)
"""

# Writes a checkpoint, then runs past its time limit
SLOW_SCRIPT = """import os, time
os.makedirs("ckpt", exist_ok=True)
open("ckpt/step_5.pt", "w").write("weights")
print("saved ckpt/step_5.pt", flush=True)
time.sleep(60)
"""


def parses(command: str) -> None:
    """A fix is a whole gpuq command line that gpuq's parser reads."""
    words = shlex.split(command)
    assert words[0] == "gpuq"
    parse(words[1:])


def commands(found: dict) -> list[str]:
    for fix in found["fixes"]:
        parses(fix["command"])
    return [fix["command"] for fix in found["fixes"]]


def test_a_cuda_oom_a_job_after_it_and_a_held_job(gq: Env) -> None:
    gq.script("train.py", OOM_SCRIPT)
    oom = gq.add("--gpu-mem", "4G", "train.py", "--batch_size", "32")
    after = gq.add("--after", str(oom), "train.py")
    held = gq.add("--hold", "train.py")
    gq.start_worker()
    gq.wait_state(oom, "failed")
    wait_for(lambda: not gq.files("running"), what="the running copy to be gone")  # the move's second half
    sp = Spool(gq.home)

    found = triage(sp, oom)
    assert (found["state"], found["exit_code"], found["cause"]) == ("failed", 1, "gpu_out_of_memory")
    assert found["reason"] == "CUDA out of memory (tried to allocate 2.00 GiB)"
    assert found["tried_to_allocate"] == "2.00 GiB" and found["run_seconds"] is not None
    assert found["log_tail"][0] == "step 3/100" and found["log_tail"][-1].startswith("torch.OutOfMemoryError")
    assert found["checkpoint"]["latest"] is None
    smaller, bigger, retry = commands(found)
    assert "--batch_size 16" in smaller and smaller.startswith("gpuq add ")
    assert "--gpu-mem 6144M " in bigger  # the 4 GiB it had and the 2 GiB it tried to allocate
    assert retry == f"gpuq retry {oom}"
    proc = gq.gpuq(*shlex.split(smaller)[1:])  # the fix queues what it says
    requeued = int(proc.stdout.split("#", 1)[1].split(":", 1)[0])
    job = gq.job(requeued)
    assert job["cmd"][-2:] == ["--batch_size", "16"] and job["gpu_mem_mib"] == 4096 and job["cwd"] == str(gq.work)

    waiting = triage(sp, after)
    assert (
        waiting["waiting_for"]
        == f"blocked: after #{oom} (failed): will not start; `gpuq retry {oom}` or `gpuq cancel {after}`"
    )
    assert commands(waiting) == [f"gpuq retry {oom}"] and "CUDA out of memory" in waiting["fixes"][0]["why"]

    assert commands(triage(sp, held)) == [f"gpuq release {held}"]

    text = gq.gpuq("triage", str(oom)).stdout  # the card, end to end
    assert f"#{oom} " in text and "CUDA out of memory (tried to allocate 2.00 GiB)" in text and retry in text
    assert json.loads(gq.gpuq("triage", "--json", str(oom)).stdout)["fixes"] == found["fixes"]


def triage_of(gq: Env, job: int) -> dict:
    return json.loads(gq.gpuq("triage", "--json", str(job)).stdout)


def test_a_job_this_worker_can_never_start_is_offered_the_edit_that_fits(gq: Env) -> None:
    """Jobs asking more GPUs, memory on a GPU, CPUs or host memory than the worker has: triage
    offers the edit to what it has (it said "nothing to fix"), and each job so edited runs."""
    gpus = Gpus(gq, fake_gpus(4, total=300_000))  # as they were queued; the worker has less
    asks = {
        ("--gpus", "4"): "gpus=1",
        ("--gpu-mem", "200G"): "gpu_mem=79G",  # the GPU's 79.6 GiB, rounded down
        ("--cpus", "1000"): "cpus=2",
        ("--mem", "100G"): "mem=10G",
    }
    jobs = {gq.add(*ask, "true"): setting for ask, setting in asks.items()}
    gpus.set(fake_gpus(1))
    gq.start_worker("--watch", "--cpus", "2", "--mem", "10G")
    for job, setting in jobs.items():
        found = wait_for(lambda j=job: (t := triage_of(gq, j))["waiting_for"].startswith("blocked: ") and t)
        assert commands(found) == [f"gpuq edit {job} --set {setting}"]
    for job, setting in jobs.items():
        gq.gpuq("edit", str(job), "--set", setting)
    for job in jobs:
        gq.wait_state(job, "done")
    gq.gpuq("stop")


def test_a_job_needing_more_memory_on_each_of_its_gpus_is_offered_the_size_that_fits(gq: Env) -> None:
    """`needs 60.0 GiB on each of 3 GPUs` on GPUs of 80, 80 and 39 GiB: triage offers the edit to
    what 3 of them have (it said "nothing to fix"; the reason named the largest GPU, on which the
    job would still not fit), and each job so edited runs."""
    gpus = Gpus(gq, fake_gpus(4, total=300_000))  # as they were queued; the worker has less
    asks = {("2", "200G"): "gpu_mem=79G", ("3", "60G"): "gpu_mem=39G"}  # 39G: GPU 2's 39.1 GiB
    jobs = {gq.add("--gpus", count, "--gpu-mem", size, "true"): setting for (count, size), setting in asks.items()}
    smaller = fake_gpus(3)
    smaller["gpus"][2]["memory_total_mib"] = 40000
    gpus.set(smaller)
    gq.start_worker("--watch")
    for job, setting in jobs.items():
        found = wait_for(lambda j=job: (t := triage_of(gq, j))["waiting_for"].startswith("blocked: ") and t)
        assert commands(found) == [f"gpuq edit {job} --set {setting}"], found["waiting_for"]
        gq.gpuq("edit", str(job), "--set", setting)
        gq.wait_state(job, "done")
    gq.gpuq("stop")


def test_a_job_waiting_for_a_gpu_says_what_it_waits_for_once(gq: Env) -> None:
    """Its reason begins as `status` says it ("waiting for GPU 0: ..."), after the label that says
    the same: triage printed "waiting for  waiting for GPU 0"."""
    Gpus(gq, fake_gpus(1, foreign={0: (os.getpid(), 80000)}))
    job = gq.add("--gpus", "1", "true")
    gq.start_worker("--watch")
    wait_for(lambda: triage_of(gq, job)["waiting_for"].startswith("waiting for GPU 0: "), what="the wait for GPU 0")
    shown = gq.gpuq("triage", str(job)).stdout.splitlines()
    assert shown[0].startswith(f"#{job} work/true: pending: waiting for GPU 0: 78.1 GiB held by pid "), shown
    assert "waiting for" not in "\n".join(shown[1:])


def test_every_kind_of_wait_reads_as_one_line_after_the_state(gq: Env) -> None:
    """Reasons that do not begin "waiting for" read after no label: triage printed "waiting for
    no worker is running; ..." and "waiting for  after #1"."""
    first = gq.add("sleep", "100")
    second = gq.add("--after", str(first), "true")
    assert gq.gpuq("triage", str(first)).stdout.splitlines()[0] == (
        f"#{first} work/sleep: pending: no worker is running; `gpuq run --daemon` starts one"
    )
    assert gq.gpuq("triage", str(second)).stdout.splitlines()[0] == f"#{second} work/true: pending: after #{first}"
    gq.gpuq("hold", str(second))
    shown = gq.gpuq("triage", str(second)).stdout.splitlines()
    assert shown[0] == f"#{second} work/true: held by user (`gpuq release` puts it back in line)", shown
    assert not any(line.startswith("  waiting for") for line in shown)


def test_an_unknown_id_is_refused_as_show_refuses_it(gq: Env) -> None:
    gq.script("train.py", "print(1)\n")
    gq.add("--hold", "train.py")
    with pytest.raises(Refused):
        triage(Spool(gq.home), 99)
    triaged, shown = gq.gpuq("triage", "99", check=False), gq.gpuq("show", "99", check=False)
    assert (triaged.returncode, triaged.stderr) == (shown.returncode, shown.stderr) == (1, "gpuq: no such job #99\n")


def test_a_job_stopped_at_its_time_limit_offers_its_checkpoint_and_more_time(gq: Env) -> None:
    gq.script("slow.py", SLOW_SCRIPT)
    job_id = gq.add("--time", "1s", "--ckpt-glob", "ckpt/step_*.pt", "slow.py")
    gq.start_worker()
    gq.wait_state(job_id, "failed", timeout=30)
    wait_for(lambda: not gq.files("running"), what="the running copy to be gone")  # the move's second half
    found = triage(Spool(gq.home), job_id)
    assert found["cause"] == "time_limit" and found["reason"] == "time limit of 1s reached"
    assert found["checkpoint"]["latest"] == str(gq.work / "ckpt" / "step_5.pt") and found["checkpoint"]["step"] == 5
    assert found["log_tail"] == ["saved ckpt/step_5.pt"]
    retry, longer = commands(found)
    assert retry == f"gpuq retry {job_id}" and "step_5.pt" in found["fixes"][0]["why"]
    words = shlex.split(longer)
    assert (
        words[:2] == ["gpuq", "add"]
        and "--time 2s" in longer
        and words[words.index("--ckpt-glob") + 1] == "ckpt/step_*.pt"
    )


def test_the_workers_default_time_is_shown_and_doubled_by_the_fix(gq: Env) -> None:
    gq.script("slow.py", "import time\ntime.sleep(60)\n")
    gq.start_worker("--default-time", "4s")  # long enough for `show` to see it run on a loaded machine
    job_id = gq.add("slow.py")
    gq.wait_state(job_id, "running")
    wait_for(lambda: "4s (the worker's --default-time)" in gq.gpuq("show", str(job_id)).stdout, 10, what="its limit")
    gq.wait_state(job_id, "failed", timeout=30)
    wait_for(lambda: not gq.files("running"), what="the running copy to be gone")  # the move's second half
    assert json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)["time_limit"] == 4.0
    found = triage_of(gq, job_id)
    assert found["cause"] == "time_limit" and [c for c in commands(found) if "--time 8s" in c], found["fixes"]
    assert f"gpuq retry {job_id}" not in commands(found)  # it would meet the same limit again


def test_a_job_stopped_at_its_mem_is_offered_twice_the_memory(tmp_path: Path) -> None:
    job = schema.validate(
        dict(schema.new_job(job_id=7, name="n", cmd=["t.py"], cwd="/", log="/x.log", env={}, after=[]), mem_mib=200)
    )
    cause = cause_of("host memory limit of 200M reached")
    assert cause == "host_out_of_memory"
    fixed = [fix["command"] for fix in fixes.suggest(Spool(tmp_path), job, "failed", {"cause": cause})]
    assert "--mem 400M" in fixed[0], fixed
    for command in fixed:
        parses(command)


def test_the_log_tail_of_a_1_gib_log_is_read_from_its_end(gq: Env) -> None:
    gq.script("train.py", OOM_SCRIPT)
    job_id = gq.add("train.py")
    gq.start_worker()
    gq.wait_state(job_id, "failed")
    wait_for(lambda: not gq.files("running"), what="the running copy to be gone")  # the move's second half
    log = gq.home / "logs" / f"{job_id:06d}.log"
    os.truncate(log, 1 << 30)  # sparse: a GiB of NULs without a line break
    with open(log, "a") as fh:
        fh.write("\nthe last line\n")
    read_before = _bytes_read()
    found = triage(Spool(gq.home), job_id, lines=5)
    read = _bytes_read() - read_before
    assert found["log_tail"][-1] == "the last line" and len(found["log_tail"]) == 2
    assert all(len(line) <= MAX_LINE_CHARS for line in found["log_tail"])
    assert read < 4 << 20, f"read {read} bytes"  # the tail, the job file, a few small files: not the GiB


def _bytes_read() -> int:
    """What this process has read so far (the kernel's count of bytes its read calls returned)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize(
    ("tail", "exit_code", "signal", "cause"),
    [
        (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n", 1, None, "gpu_out_of_memory"),
        (
            b"XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1024 bytes\n",
            1,
            None,
            "gpu_out_of_memory",
        ),
        (
            b"RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 bytes\n",
            1,
            None,
            "host_out_of_memory",
        ),
        (b"", -9, "SIGKILL", "killed_sigkill"),
        (b"OSError: [Errno 28] No space left on device\n", 1, None, "disk_full"),
        (b"ValueError: bad\n", 1, None, "other"),
    ],
)
def test_each_cause_is_told_from_failures_own_wording(tail: bytes, exit_code: int, signal: str, cause: str) -> None:
    assert cause_of(failure.reason(tail, exit_code, signal)) == cause


def test_the_time_limit_and_gpuq_kill_causes() -> None:
    assert cause_of(failure.reason(b"", -15, "SIGTERM", time_limit=90)) == "time_limit"
    assert cause_of(failure.reason(b"", -15, "SIGTERM", killed_by_user=True)) == "killed_by_user"
    assert cause_of(None, "preempted (its time limit of 4h00m was reached)") == "time_limit"


@pytest.mark.parametrize(
    ("cmd", "halved"),
    [
        (["python", "t.py", "--batch_size", "32"], ["python", "t.py", "--batch_size", "16"]),
        (
            ["python", "t.py", "--per-device-train-batch-size", "8", "--lr", "1"],
            ["python", "t.py", "--per-device-train-batch-size", "4", "--lr", "1"],
        ),
        (["python", "t.py", "--train_batch_size=64"], ["python", "t.py", "--train_batch_size=32"]),
        (["python", "t.py", "data.batch_size=6"], ["python", "t.py", "data.batch_size=3"]),
        (["python", "t.py", "--batch_size", "1"], None),
        (["python", "t.py", "--lr", "32"], None),
    ],
)
def test_the_batch_size_is_found_in_its_usual_spellings(cmd: list[str], halved: list[str]) -> None:
    found = fixes.halve_batch(cmd)
    assert (found[0] if found else None) == halved
