"""Host memory and CPUs (issue 31): the limits are kept, not only counted. A job past its `--mem`
is ended (by gpuq's watch of its memory, or by the kernel inside its own cgroup) and fails with
"host memory limit of ... reached"; `--cpus` sets its thread pools; `show` says how they were kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from conftest import wait_for
from test_gpu_worker import fake_gpus

from gpuq.core import failure
from gpuq.system import cgroups, hostmem

# Grows to 300 MB in 10 MB steps (each written, so resident), then holds it until `go` exists.
GROWS = """\
import os, time
held = []
for _ in range(30):
    held.append(bytearray(b"x") * (10 << 20))
    time.sleep(0.02)
open("grown", "w").close()
while not os.path.exists("go"):
    time.sleep(0.02)
"""

# Holds 20 MB and says what its thread variables are.
SMALL = """\
import os
held = bytearray(b"x") * (20 << 20)
print("threads", os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"))
"""


def watched(gq: Any) -> None:
    """Workers of this test keep limits by the watch, looking every 0.2 s."""
    gq.env.update(GPUQ_HOST_LIMITS="watch", GPUQ_MEM_WATCH_SECONDS="0.2")


def test_the_watch_ends_a_job_past_its_mem(gq: Any) -> None:
    watched(gq)
    gq.script("grows.py", GROWS)
    job_id = gq.add("--mem", "100M", "--cpus", "1", "grows.py")
    gq.start_worker("--watch", "--kill-grace", "1")
    job = gq.wait_state(job_id, "failed", timeout=15)
    assert not (gq.work / "grown").exists(), "the job reached 300 MB: it was not stopped at 100M"
    # without a retry left, the reason says what an out-of-memory retry would have had
    assert job["reason"] == (
        "host memory limit of 100M reached; with a retry left (--retry-oom N) it would have been retried with "
        "200M host memory"
    )
    assert job["exit_code"] == 143 and job["host_limits_by"] == "watch:0.2"
    assert "host memory limit of 100M reached (" in gq.log(job_id)
    shown = gq.gpuq("show", str(job_id)).stdout
    assert "host limits     kept by watching memory every 0.2 s; CPUs counted, not capped" in shown, shown
    # the status row says the limit once (not again as the note's "stopped: its host memory limit ...")
    status = gq.gpuq("status").stdout
    assert status.count("host memory limit of 100M") == 1 and "was reached" not in status, status


def test_a_job_under_its_limits_runs_to_done_with_its_threads_set(gq: Any) -> None:
    watched(gq)
    gq.script("small.py", SMALL)
    plain = gq.add("--mem", "200M", "--cpus", "1", "small.py")  # 1: the worker admits it on any machine
    own = gq.add("--mem", "200M", "--cpus", "1", "--env", "OMP_NUM_THREADS=5", "small.py")
    gq.start_worker("--watch")
    for job_id in (plain, own):
        assert gq.wait_state(job_id, "done", timeout=15)["host_limits_by"] == "watch:0.2"
    assert "threads 1 1" in gq.log(plain)
    assert "threads 5 1" in gq.log(own), "the job's own OMP_NUM_THREADS was overridden"


def test_the_kernel_keeps_the_limit_where_it_can(gq: Any) -> None:
    tree, no_cgroup = cgroups.gpuq_tree()
    scope, no_scope = cgroups.user_scope() if tree is None else (False, "")
    if tree is None and not scope:
        pytest.skip(f"no kernel path here: {no_cgroup}; {no_scope}")
    gq.script("grows.py", GROWS)
    job_id = gq.add("--mem", "100M", "--cpus", "1", "grows.py")
    gq.start_worker("--watch", "--kill-grace", "1")
    job = gq.wait_state(job_id, "failed", timeout=15)
    assert job["reason"] == "host memory limit of 100M reached", gq.log(job_id)
    assert job["host_limits_by"] == ("cgroup2" if tree else "systemd-run") and "host limits kept by " in gq.log(job_id)
    assert job["exit_code"] == 137 or not tree  # systemd may stop its scope with SIGTERM after the kernel's kill
    if tree is not None:
        assert not [name for name in os.listdir(tree) if name.startswith(f"job-{job_id}-")], "its cgroup was left"
    assert "kept by " + ("cgroup v2" if tree else "systemd-run") in gq.gpuq("show", str(job_id)).stdout


# A trainer holding 100 MB that forks three workers (they share its pages), then waits.
FORKS = """\
import os, time
held = bytearray(b"x") * (100 << 20)
for _ in range(3):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print(flush=True)
time.sleep(60)
"""


def test_the_memory_of_a_tree_counts_shared_pages_once() -> None:
    """Forked workers share their parent's pages: PSS counts them once, a sum of RSS once per process."""
    import psutil

    parent = subprocess.Popen([sys.executable, "-c", FORKS], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline()
        tree = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children()]
        assert len(tree) == 4
        assert sum(proc.memory_info().rss for proc in tree) > 400 << 20  # the 100 MB once per process
        assert 100 << 20 < hostmem.tree_bytes(parent.pid) < 200 << 20
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_the_memory_limit_comes_after_the_time_limit_and_before_the_log() -> None:
    killed = b"Killed\n"
    assert failure.reason(killed, 137, "SIGKILL", host_memory="32G") == "host memory limit of 32G reached"
    assert failure.reason(killed, 137, "SIGKILL", time_limit=60, host_memory="32G") == "time limit of 1m00s reached"
    assert "OOM killer" in (failure.reason(killed, 137, "SIGKILL") or "")


def test_an_empty_path_finds_no_systemd_run_in_the_current_directory(tmp_path: Any) -> None:
    """With PATH empty, a `systemd-run` in the directory gpuq runs from is not taken for the real
    one: it would run, and hold the job's limits."""
    (tmp_path / "rt" / "systemd").mkdir(parents=True)
    (tmp_path / "rt" / "systemd" / "private").touch()
    fake = tmp_path / "systemd-run"
    fake.write_text(f"#!/bin/sh\necho ran >> {tmp_path / 'ran'}\n")
    fake.chmod(0o755)
    code = "from gpuq.system import cgroups; print(cgroups.user_scope())"
    env = dict(os.environ, PATH="", XDG_RUNTIME_DIR=str(tmp_path / "rt"))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "(False, 'no systemd-run on PATH')", out.stderr
    assert not (tmp_path / "ran").exists()


def test_a_third_attempt_after_host_memory_retries_says_its_own_retry_count_and_where_its_gpu_was(gq: Any) -> None:
    """--mem 100M --retry-oom 2 under a worker handing out 500M, on one simulated GPU: stopped at
    100M and 200M, the third attempt (400M) runs. `show` says it has GPUQ_OOM_RETRY=2 itself (not
    "its next attempt"); `show` and `history` say each attempt's GPU of the GPU, not of the host
    memory (it said `had a whole GPU, 100M host memory on GPU 0`)."""
    watched(gq)
    (gq.work / "gpus.json").write_text(json.dumps(fake_gpus(1)))
    gq.env["GPUQ_FAKE_GPUS"] = str(gq.work / "gpus.json")
    gq.script("grows.py", GROWS)
    job_id = gq.add("--mem", "100M", "--retry-oom", "2", "grows.py")
    gq.start_worker("--watch", "--mem", "500M", "--kill-grace", "1")
    wait_for(lambda: (gq.work / "grown").exists(), 30, what="the third attempt to grow to 300 MB")
    job = gq.job(job_id)
    assert job["state"] == "running" and job["attempts"] == 3 and job["oom_retries"] == 2, job
    shown = gq.gpuq("show", str(job_id)).stdout
    assert "2 of 2 (--retry-oom 2); this attempt has GPUQ_OOM_RETRY=2" in shown, shown
    for said in (shown, gq.gpuq("history", str(job_id)).stdout):
        assert "had a whole GPU (GPU 0) and 100M host memory;" in said, said
        assert "had a whole GPU (GPU 0) and 200M host memory;" in said, said
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done", timeout=20)


def test_a_negative_mem_is_said_to_be_negative(gq: Any) -> None:
    """`add --mem -1G` got argparse's "expected one argument"; `--mem=-1G` "cannot read"."""
    gq.script("x.py", "")
    for words in (["--mem", "-1G"], ["--mem=-1G"], ["--gpu-mem", "-2.5G"]):
        done = gq.gpuq("add", *words, "x.py", check=False)
        assert done.returncode == 2 and "is negative" in done.stderr, (words, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert gq.files("pending") == []


def test_ignored_host_limit_settings_are_said_once_in_the_workers_log(gq: Any) -> None:
    """GPUQ_HOST_LIMITS other than `watch` and a GPUQ_MEM_WATCH_SECONDS that is no seconds above 0
    fell back without a word, while GPUQ_HOST_MEM_MARGIN=abc was said: each is said, as the margin."""
    for mode, seconds in (("foo", "abc"), ("watch", "0"), ("", "-1")):
        gq.env.update(GPUQ_HOST_LIMITS=mode, GPUQ_MEM_WATCH_SECONDS=seconds)
        said = gq.gpuq("run").stdout  # an empty queue: the worker starts and exits
        assert (f"GPUQ_HOST_LIMITS: {mode!r} is not 'watch'" in said) == (mode == "foo"), said
        assert said.count(f"GPUQ_MEM_WATCH_SECONDS: {seconds!r} is not seconds above 0; watching every 2 s") == 1, said
    gq.env.update(GPUQ_HOST_LIMITS="watch", GPUQ_MEM_WATCH_SECONDS="0.5")
    assert "GPUQ_" not in gq.gpuq("run").stdout
    del gq.env["GPUQ_HOST_LIMITS"], gq.env["GPUQ_MEM_WATCH_SECONDS"]
    assert "GPUQ_" not in gq.gpuq("run").stdout
