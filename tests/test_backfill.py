"""Backfill with a reservation: when the first GPU job in line waits, the GPUs it would get first
(the freest) are kept for it, and the jobs behind it start on the other GPUs where they fit; a job
that fits only on the kept GPUs waits behind it. Placement's decisions, then a real worker on
simulated GPUs."""

from __future__ import annotations

import subprocess

from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus, release, row, seen, started

from gpuq.engine.schedule.placement import Blocked, Holding, Placement, Request, place_in_order, reserve
from gpuq.system.gpus import Gpu, GpuProcess

G = 1024
TWO = tuple(Gpu(i, "Fake 80GB", f"GPU-{i}", 80 * G, 0, ()) for i in range(2))
BEHIND_3 = Blocked("waiting behind job #3 (first in line for a GPU)", forever=False)


def test_the_jobs_behind_start_on_the_gpus_the_first_in_line_does_not_keep() -> None:
    # GPU 0: 20G free, its job started at 100; GPU 1: 10G free, its job started at 200
    holdings = [Holding(1, (0,), 60 * G, since=100.0), Holding(2, (1,), 70 * G, since=200.0)]
    assert reserve(Request(), TWO, None, holdings) == {0}  # whose jobs started longest ago
    requests = [(3, Request()), (4, Request(1, 10 * G)), (5, Request(1, 20 * G))]
    decisions = place_in_order(requests, TWO, None, holdings)
    assert isinstance(decisions[3], Blocked) and not decisions[3].forever
    assert decisions[4] == Placement((1,))  # beside job 2, on the GPU job 3 does not keep
    assert decisions[5] == BEHIND_3  # fits only on GPU 0, kept for job 3


def test_the_kept_gpu_stands_while_jobs_start_elsewhere_and_moves_only_to_older_ones() -> None:
    holdings = [Holding(1, (0,), 60 * G, since=100.0), Holding(2, (1,), 30 * G, since=200.0)]
    assert reserve(Request(), TWO, None, holdings) == {0}  # although GPU 1 is freer
    assert reserve(Request(), TWO, None, [*holdings, Holding(4, (1,), 10 * G)]) == {0}
    older = [Holding(1, (0,), 60 * G, since=100.0), Holding(2, (1,), 30 * G, since=50.0)]
    assert reserve(Request(), TWO, None, older) == {1}
    assert reserve(Request(), TWO, None, []) == {0}  # nothing runs: the freest, then the lowest index


def test_a_job_whose_best_fit_is_the_kept_gpu_goes_to_another_that_fits() -> None:
    # 30G free on GPU 0, 40G on GPU 1; GPU 0's job started first: it is kept for a 50G job
    holdings = [Holding(1, (0,), 50 * G, since=100.0), Holding(2, (1,), 40 * G, since=200.0)]
    decisions = place_in_order([(3, Request(1, 50 * G)), (4, Request(1, 30 * G))], TWO, None, holdings)
    assert isinstance(decisions[3], Blocked)
    assert decisions[4] == Placement((1,))  # its best fit, GPU 0 (exactly 30G), is kept


def test_a_job_starts_on_the_kept_gpu_when_the_first_in_line_waits_only_for_another_program() -> None:
    """40G of another program on the one GPU: a 60G job waits for it, and a 10G job behind it
    starts, since 60G still fits beside it once the program leaves; a 30G one, which would leave
    the 60G job no room, waits behind it, as does any job behind a whole-GPU one."""
    outside = (Gpu(0, "Fake 80GB", "GPU-0", 80 * G, 40 * G, (GpuProcess(4242, 40 * G),)),)
    requests = [(3, Request(1, 60 * G)), (4, Request(1, 10 * G)), (5, Request(1, 30 * G))]
    decisions = place_in_order(requests, outside)
    assert isinstance(decisions[3], Blocked) and not decisions[3].forever
    assert decisions[4] == Placement((0,)) and decisions[5] == BEHIND_3
    # gpuq's own 15G there already: 60 + 15 + 10 fits no more
    decisions = place_in_order(requests[:2], outside, holdings=[Holding(1, (0,), 15 * G)])
    assert decisions[4] == BEHIND_3
    assert place_in_order([(3, Request()), (4, Request(1, 10 * G))], outside)[4] == BEHIND_3


def test_a_job_that_needs_every_gpu_keeps_them_all() -> None:
    holdings = [Holding(1, (0,), 40 * G)]
    decisions = place_in_order([(3, Request(gpus=2)), (4, Request(1, 10 * G))], TWO, None, holdings)
    assert decisions[4] == BEHIND_3


def test_a_worker_backfills_beside_the_first_in_line_and_starts_it_when_its_gpu_empties(gq: Env) -> None:
    """GPU 0 holds a 30G job, GPU 1 a 60G one started after it; a whole-GPU job waits, keeping
    GPU 0 (its job started first); a 10G job behind it starts on GPU 1, a 40G one, which fits only
    on GPU 0, waits behind it; once GPU 0's job ends the whole-GPU job starts there."""
    Gpus(gq, fake_gpus(2, total=80 * G))
    gq.script("job.py", _HOLDS)
    first = gq.add("--gpu-mem", "30G", "job.py", "first")
    gq.start_worker("--watch")
    assert seen(gq, first)["gpus"] == "0"
    second = gq.add("--gpu-mem", "60G", "job.py", "second")
    assert seen(gq, second)["gpus"] == "1"
    whole = gq.add("job.py", "whole")
    small = gq.add("--gpu-mem", "10G", "job.py", "small")
    middle = gq.add("--gpu-mem", "40G", "job.py", "middle")
    assert seen(gq, small)["gpus"] == "1"  # behind the waiting whole-GPU job, beside the 60G one
    reason = wait_for(lambda: row(gq, middle)["waiting"], 15, what="the 40G job's reason")
    assert reason.startswith(f"waiting behind #{whole}, first in line for a GPU"), reason
    assert not started(gq, whole) and not started(gq, middle)
    (gq.work / "end-first").write_text("")
    assert seen(gq, whole)["gpus"] == "0"
    assert not started(gq, middle)  # GPU 1 has 10G free, GPU 0 is held whole
    release(gq)


def test_a_worker_starts_a_small_job_beside_another_program_the_first_in_line_waits_for(gq: Env) -> None:
    """Another program holds 40G of the one GPU: a 60G job waits for it, and a 10G job behind it
    starts (it waited "behind #1, first in line" with 39.6 GiB free); once the program's memory is
    gone the 60G job starts beside it."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        gpus = Gpus(gq, fake_gpus(1, foreign={0: (other.pid, 40 * G)}))
        gq.script("job.py", _HOLDS)
        big = gq.add("--gpu-mem", "60G", "job.py", "big")
        small = gq.add("--gpu-mem", "10G", "job.py", "small")
        gq.start_worker("--watch")
        assert seen(gq, small)["gpus"] == "0"
        assert not started(gq, big) and "40.0 GiB held by pid" in row(gq, big)["waiting"]
        gpus.set(fake_gpus(1))
        assert seen(gq, big)["gpus"] == "0"
        release(gq)
    finally:
        other.kill()
        other.wait()


# Records where it runs in seen-ID.json, then runs until `release` (or `end-NAME`) exists.
_HOLDS = """import json, os, sys, time
name = sys.argv[1]
with open(f"seen-{os.environ['GPUQ_JOB_ID']}.json", "w") as fh:
    json.dump({"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "name": name}, fh)
while not (os.path.exists("release") or os.path.exists(f"end-{name}")):
    time.sleep(0.02)
"""
