#!/usr/bin/env python3
"""What one scheduling step of the worker costs, part by part, with N jobs pending (issue 15).

Builds a spool with N pending `true` jobs (through gpuq's own enqueue), then takes 30 steps' parts
in-process, each after one job left pending/ (as a start does), and prints the median of each part
in ms: the repair pass, the intake turn, automatic resumes, the snapshot, the plan. Nothing is
started (the plan is computed, not carried out).

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

from gpuq.engine import enqueue
from gpuq.engine.preempt import resume_auto
from gpuq.engine.snapshot import snapshot
from gpuq.run.worker import Worker
from gpuq.spool import Spool


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
        worker = Worker(spool, say=lambda _line: None)
        parts: dict[str, list[float]] = {k: [] for k in ("repair", "intake", "resume", "snapshot", "plan")}
        pending, done = spool.layout.state_dir("pending"), spool.layout.state_dir("done")
        names = sorted(os.listdir(pending))
        for name in names[:steps]:
            os.rename(os.path.join(pending, name), os.path.join(done, name))
            now = time.time()
            t0 = time.perf_counter()
            worker._repair(now)
            t1 = time.perf_counter()
            worker._take_in_dropped(now)
            t2 = time.perf_counter()
            list(resume_auto(spool))
            t3 = time.perf_counter()
            snap, _invalid = snapshot(spool, worker.cache, now=now)
            t4 = time.perf_counter()
            worker._plan(snap, now)
            t5 = time.perf_counter()
            for key, a, b in (("repair", t0, t1), ("intake", t1, t2), ("resume", t2, t3), ("snapshot", t3, t4)):
                parts[key].append((b - a) * 1000)
            parts["plan"].append((t5 - t4) * 1000)
        return {k: statistics.median(v) for k, v in parts.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    for size in [int(a) for a in sys.argv[1:]] or [50, 500]:
        shown = ", ".join(f"{k} {v:.2f}" for k, v in main(size).items())
        print(f"{size} pending: {shown} (ms, medians; load {os.getloadavg()[0]:.1f})")
