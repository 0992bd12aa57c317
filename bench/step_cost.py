#!/usr/bin/env python3
"""What one scheduling step of the worker costs, part by part, with N jobs pending (issue 15).

Builds a spool with N pending `true` jobs (through gpuq's own enqueue), then takes 30 steps' parts
in-process, each after one job left pending/ (as at a start; it goes to done/ here, with nobody to
supervise it), and prints the median of each part in ms: the repair pass, the intake turn (when
one is due), automatic resumes, the look at the queue as a busy worker takes it (the files the
events named, engine/schedule/queue_view.py), the same look taken in full (as at least every 5 s), and the
plan. Nothing is started (the plan is computed,
not carried out).

    python bench/step_cost.py 500
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuq.engine.lifecycle import enqueue
from gpuq.engine.lifecycle.preempt import resume_auto
from gpuq.engine.schedule.queue_view import QueueView
from gpuq.run.launcher import Launcher
from gpuq.run.worker import Worker
from gpuq.spool import Spool

PARTS = ("repair", "intake", "resume", "look", "full look", "plan")


def main(pending: int, steps: int = 30) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="gpuq-step-"))
    try:
        spool, work = Spool(root / "spool").ensure(), root / "work"
        work.mkdir()
        for _ in range(pending):
            enqueue.enqueue(
                spool, cmd=["true"], cwd=work, name=None, venv=None, env={}, shell_env=dict(os.environ),
                after=[], after_any=[], retries=0,
            )  # fmt: skip
        worker = Worker(spool, Launcher(spool), say=lambda _line: None)
        worker.view.watching(True)  # as under the loop's observer
        full = QueueView()  # a second view, looking in full every time
        parts: dict[str, list[float]] = {k: [] for k in PARTS}
        pending_dir, done_dir = spool.layout.state_dir("pending"), spool.layout.state_dir("done")
        names = sorted(os.listdir(pending_dir))
        worker.view.look(spool, time.time())
        full.look(spool, time.time())
        for name in names[:steps]:
            os.rename(os.path.join(pending_dir, name), os.path.join(done_dir, name))
            worker.view.note("pending", name)  # the event of its leaving
            now = time.time()
            t0 = time.perf_counter()
            worker._repair(now)
            t1 = time.perf_counter()
            if worker.view.intake_due(now):
                worker._take_in_dropped(now)
            t2 = time.perf_counter()
            list(resume_auto(spool))
            t3 = time.perf_counter()
            snap, _invalid = worker.view.look(spool, now)
            t4 = time.perf_counter()
            full.doubt()
            full.look(spool, now)
            t5 = time.perf_counter()
            worker._plan(snap, now)
            t6 = time.perf_counter()
            worker.view.full_at = now  # a full look is due every 5 s; this measures the steps between
            times = (t0, t1, t2, t3, t4, t5, t6)
            for key, a, b in zip(PARTS, times, times[1:]):
                parts[key].append((b - a) * 1000)
        return {k: statistics.median(v) for k, v in parts.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    for size in [int(a) for a in sys.argv[1:]] or [50, 500]:
        shown = ", ".join(f"{k} {v:.2f}" for k, v in main(size).items())
        print(f"{size} pending: {shown} (ms, medians; load {os.getloadavg()[0]:.1f})")
