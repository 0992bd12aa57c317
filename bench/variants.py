"""Issue 27's variants of the dispatch and back-to-back scenarios (bench/scenarios.py), in the
situations users are in: `add` inside a git repository with a dirty tree, and GPU machines
(simulated GPUs, `GPUQ_FAKE_GPUS`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import scenarios
from common import BenchError, read_stamp, stamp_command, wait_for
from researcher import make_repo
from systems import Gpuq, System, Tsp, make, settle

# Between two rounds of dispatch_git, every queue is left alone this long: longer than anything
# gpuq's worker does differently once idle (FULL_LOOK_SECONDS: the full look and repair are due),
# so each `add` meets a worker idle as a user's is; its spare supervisor waits as long as it must, so
# that a longer pause would measure the same.
IDLE_ROUND_SECONDS = 6.0


def dispatch_git(names: list[str], root: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """scenarios.dispatch with every queue's commands run from inside the same git repository:
    sizes["git_files"] tracked files, one of them changed (gpuq records the code's commit and
    state), and each of sizes["dispatch"] rounds taken after sizes["dispatch_idle"] seconds
    (IDLE_ROUND_SECONDS in a full run) in which no queue had anything to do."""
    samples, idle = sizes["dispatch"], sizes["dispatch_idle"]
    repo = make_repo(root / "repo", sizes["git_files"])
    queues = [make(name, root / name) for name in names]
    try:
        for queue in queues:
            queue.work = repo
        scenarios.started(queues)
        out: dict[str, dict[str, list[float]]] = {q.name: {"queued": [], "submitted": []} for q in queues}
        for n in range(samples):
            settle(idle)
            for queue in scenarios.rotated(queues, n):
                sample = _dispatch_once(queue, root / f"dgit-{queue.name}-{n}")
                for key, value in sample.items():
                    out[queue.name][key].append(value)
        return out
    finally:
        for queue in queues:
            queue.stop()


def _dispatch_once(queue: System, stamp: Path) -> dict[str, float]:
    """One job added; from the add's start and from its return to the job's first instruction."""
    t_invoke = time.time()
    job_id = queue.add(stamp_command(stamp))
    t_return = time.time()
    t_job = read_stamp(stamp)
    queue.wait_done(job_id)
    return {"queued": t_job - t_return, "submitted": t_job - t_invoke}


def back_to_back_gpus(names: list[str], root: Path, pairs: int) -> dict[str, Any]:
    """scenarios.back_to_back on a machine of two GPUs, one job per GPU: gpuq with two simulated
    GPUs, task-spooler with two slots; a long job holds one GPU (slot) throughout, so that B, queued
    while A runs, waits for A's GPU and starts when A ends. nq runs one job at a time (no slots)
    and is left out."""
    queues: list[System] = []
    for name in (n for n in names if n in ("gpuq", "tsp")):
        queue = make(name, root / name)
        if isinstance(queue, Gpuq):
            queue.simulate_gpus(2)
        if isinstance(queue, Tsp):
            queue.env["TS_SLOTS"] = "2"
        queues.append(queue)
    try:
        scenarios.started(queues)
        for queue in queues:
            _hold_one_gpu(queue)
        settle(1.0)
        return scenarios.back_to_back(queues, root, pairs)
    finally:
        for queue in queues:
            queue.stop()


def _hold_one_gpu(queue: System) -> None:
    """A job that keeps one of the two GPUs (slots) busy until the queue is stopped."""
    job_id = queue.add(["sleep", "3600"])
    if isinstance(queue, Gpuq):
        from gpuq.core.states import RUNNING

        wait_for(lambda: queue.state(job_id) == RUNNING, 30, "the gpuq job holding a GPU to run")
        gpus = queue.spool.jobs.load(queue.spool.jobs.find(int(job_id))).gpus
        if gpus is None or len(gpus) != 1:
            raise BenchError(f"the gpuq job holding a GPU holds {gpus}, not one simulated GPU")


__all__ = ["dispatch_git", "back_to_back_gpus"]
