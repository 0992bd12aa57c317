"""Issue 27's variants of the dispatch and back-to-back scenarios (bench/scenarios.py), in the
situations users are in: `add` inside a git repository with a dirty tree, and GPU machines
(simulated GPUs, `GPUQ_FAKE_GPUS`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scenarios
from common import BenchError, wait_for
from researcher import make_repo
from systems import Gpuq, System, Tsp, make, settle


def dispatch_git(names: list[str], root: Path, samples: int, files: int) -> dict[str, Any]:
    """scenarios.dispatch with every queue's commands run from inside the same git repository:
    `files` tracked files, one of them changed (gpuq records the code's commit and state)."""
    repo = make_repo(root / "repo", files)
    queues = [make(name, root / name) for name in names]
    try:
        for queue in queues:
            queue.work = repo
        scenarios.started(queues)
        settle(1.0)
        return scenarios.dispatch(queues, root, samples)
    finally:
        for queue in queues:
            queue.stop()


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
