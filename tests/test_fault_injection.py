"""Fault injection: many short jobs, three --gpus workers SIGKILLed at random moments and
restarted, concurrent adders and hand-dropped files. Every job must end in done/, started
exactly once, with no file in two states and no lock or tmp file left behind. The adders add
until the last kill: every kill lands while jobs still come, however fast the machine."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter

from conftest import STATES, Env, wait_for

ADDERS = 4
JOBS_DROPPED = 40
KILLS = 12


def _adder(gq: Env, starts, enough) -> subprocess.Popen:
    """Adds jobs one `gpuq add` after another until the file `enough` appears; prints how many."""
    code = (
        "import os, subprocess, sys\n"
        "added = 0\n"
        "while added < 10 or not os.path.exists(sys.argv[2]):\n"
        "    subprocess.run([sys.executable, '-m', 'gpuq', 'add', '-q', 'sh', '-c', sys.argv[1]],\n"
        "                   check=True, stdout=subprocess.DEVNULL)\n"
        "    added += 1\n"
        "print(added)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, _job_line(starts), str(enough)],
        cwd=gq.work, env=gq.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _job_line(starts) -> str:
    # `>>` opens with O_APPEND: concurrent starts never overwrite each other's line. The jobs run
    # 0-0.2 s: hand-overs and starts are under way at any moment a kill lands.
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
    began = time.monotonic()
    enough = gq.work / "enough"
    adders = [_adder(gq, starts, enough) for _ in range(ADDERS)]
    _drop_files(gq, starts)
    for _kill in range(KILLS):
        time.sleep(rng.uniform(0.3, 1.0))  # a random moment in the workers' lives (the faults' pace)
        gpu = rng.choice(sorted(workers))
        workers[gpu].kill()
        workers[gpu].wait()
        workers[gpu] = gq.start_worker("--watch", "--gpus", gpu)
    enough.touch()  # the adders were adding until now: no kill came after the work
    added = []
    for adder in adders:
        out, _ = adder.communicate(timeout=60)
        assert adder.returncode == 0
        added.append(int(out))
    total = sum(added) + JOBS_DROPPED
    finished = [state for state in STATES if state not in ("pending", "running")]
    ended = lambda: sum(n.endswith(".json") for state in finished for n in gq.files(state))  # noqa: E731
    wait_for(lambda: ended() >= total, 120, interval=0.2, what=f"the {total} jobs to end under the last workers")
    for proc in workers.values():
        proc.terminate()
        # 0: a clean stop; -SIGTERM: it was killed while still starting, before its handler existed
        assert proc.wait(20) in (0, -15)
    # A final drain: its first step repairs whatever the last kills left (stale claims, tmp files).
    gq.gpuq("run", timeout=60)
    gq.gpuq("status")

    print(f"{KILLS} worker kills among {total} jobs; all done after {time.monotonic() - began:.1f}s")
    names = {state: [n for n in gq.files(state) if n.endswith(".json")] for state in STATES}
    assert len(names["done"]) == total, {s: len(v) for s, v in names.items()}
    ids = [int(n.split("-")[0]) for v in names.values() for n in v]
    assert len(ids) == len(set(ids)), "a job file is in two states"
    # Ids MAY have gaps (spool_layout.md): a worker killed between allocating an id for a dropped
    # file and renaming the file to its intake name loses that id; the file gets the next one.
    assert len(ids) == total
    counts = Counter(starts.read_text().split())
    assert set(counts) == {str(i) for i in ids}, "a job that ran is not in done/, or one in done/ never ran"
    assert [job for job, n in counts.items() if n != 1] == [], "jobs started more than once"
    assert os.listdir(gq.home / "locks") == []
    assert os.listdir(gq.home / "tmp") == []
    assert [n for n in os.listdir(gq.home / "pending")] == []
    assert gq.files("rejected") == []
