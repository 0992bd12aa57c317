"""Fault injection: many short jobs, three --gpus workers SIGKILLed at random moments and
restarted, concurrent adders and hand-dropped files. Every job must end in done/, started
exactly once, with no file in two states and no lock or tmp file left behind."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter

from conftest import STATES, Env

JOBS_BY_CLI = 4 * 40
JOBS_DROPPED = 40
TOTAL = JOBS_BY_CLI + JOBS_DROPPED
DEADLINE_SECONDS = 100


def _adder(gq: Env, starts) -> subprocess.Popen:
    code = (
        "import subprocess, sys\n"
        "for _ in range(40):\n"
        "    subprocess.run([sys.executable, '-m', 'gpuq', 'add', '-q', 'sh', '-c', sys.argv[1]],\n"
        "                   check=True, stdout=subprocess.DEVNULL)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, _job_line(starts)], cwd=gq.work, env=gq.env)


def _job_line(starts) -> str:
    # `>>` opens with O_APPEND: concurrent starts never overwrite each other's line. The jobs run
    # 0-0.2 s, so that the queue is still at work when the tenth kill comes (at 0.02-0.04 s the
    # 200 jobs could all be done after eight)
    return f"echo $GPUQ_JOB_ID >> {starts}; sleep 0.$(($GPUQ_JOB_ID % 3))"


def _drop_files(gq: Env, starts) -> None:
    for n in range(JOBS_DROPPED):
        tmp = gq.work / f".drop{n}"
        tmp.write_text(json.dumps({"cmd": ["sh", "-c", _job_line(starts)], "cwd": str(gq.work)}))
        os.chmod(tmp, 0o600)
        os.rename(tmp, gq.home / "pending" / f"drop{n}.json")
        time.sleep(0.01)  # the pace of a program dropping files


def test_random_worker_kills_lose_nothing_and_start_nothing_twice(gq: Env) -> None:
    rng = random.Random(int(os.environ.get("GPUQ_FAULT_SEED", "12345")))
    starts = gq.work / "starts"
    gq.gpuq("status")  # creates the spool
    workers = {gpu: gq.start_worker("--watch", "--gpus", gpu) for gpu in ("0", "1", "2")}
    adders = [_adder(gq, starts) for _ in range(4)]
    _drop_files(gq, starts)
    kills = 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        done = len([n for n in os.listdir(gq.home / "done") if n.endswith(".json")])
        if done >= TOTAL and all(a.poll() is not None for a in adders):
            break
        time.sleep(rng.uniform(0.3, 1.0))  # a random moment in the workers' lives
        gpu = rng.choice(sorted(workers))
        workers[gpu].kill()
        workers[gpu].wait()
        kills += 1
        workers[gpu] = gq.start_worker("--watch", "--gpus", gpu)
    assert all(a.wait(30) == 0 for a in adders)
    for proc in workers.values():
        proc.terminate()
        # 0: a clean stop; -SIGTERM: it was killed while still starting, before its handler existed
        assert proc.wait(20) in (0, -15)
    # A final drain: its first step repairs whatever the last kills left (stale claims, tmp files).
    gq.gpuq("run", timeout=60)
    gq.gpuq("status")

    print(f"{kills} worker kills; all jobs done after {time.monotonic() - deadline + DEADLINE_SECONDS:.1f}s")
    assert kills >= 10
    names = {state: [n for n in gq.files(state) if n.endswith(".json")] for state in STATES}
    assert len(names["done"]) == TOTAL, {s: len(v) for s, v in names.items()}
    ids = [int(n.split("-")[0]) for v in names.values() for n in v]
    assert len(ids) == len(set(ids)), "a job file is in two states"
    # Ids MAY have gaps (spool_layout.md): a worker killed between allocating an id for a dropped
    # file and renaming the file to its intake name loses that id; the file gets the next one.
    assert len(ids) == TOTAL
    counts = Counter(starts.read_text().split())
    assert set(counts) == {str(i) for i in ids}, "a job that ran is not in done/, or one in done/ never ran"
    assert [job for job, n in counts.items() if n != 1] == [], "jobs started more than once"
    assert os.listdir(gq.home / "locks") == []
    assert os.listdir(gq.home / "tmp") == []
    assert [n for n in os.listdir(gq.home / "pending")] == []
    assert gq.files("rejected") == []
