"""A GPU job's supervisor samples the job's GPUs while it waits for the job (run/supervisor/wait.py):
one look every GPUQ_GPU_SAMPLE_SECONDS, added to the attempt's record (engine/tracking/gpuuse.py).
A CPU job, or a machine without GPUs, has no sampler: nothing is looked at and nothing written."""

from __future__ import annotations

import time
from typing import Any, Optional

from gpuq.core.times import parse_iso
from gpuq.engine.tracking import gpuuse
from gpuq.run.supervisor.start import Run, log_line
from gpuq.system import gpus


class Sampler:
    def __init__(self, run: Run, held: tuple[int, ...]):
        self.run, self.held = run, list(held)
        self.period = gpuuse.sample_seconds()
        started = parse_iso(run.job.started_at) or time.time()
        self.record = run.spool.reports.read_gpu_use(run.job.id)  # earlier attempts' records stay
        attempts = self.record.get("attempts")
        self.record["attempts"] = attempts = attempts if isinstance(attempts, dict) else {}
        self.attempt = attempts[str(run.job.attempts)] = gpuuse.new_attempt(self.held, started)
        self.due = started + self.period
        self.failed = False

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.time())

    def take_if_due(self) -> None:
        now = time.time()
        if now < self.due:
            return
        self.due = now + self.period
        try:
            self._take(now)
        except Exception as exc:  # noqa: BLE001 - figures only: the wait for the job must not end for this
            if not self.failed:
                log_line(self.run.log_fd, f"GPU utilisation not recorded: {exc}")
            self.failed = True

    def _take(self, now: float) -> None:
        by_index = {gpu.index: gpu for gpu in gpus.look().gpus}
        seen = [by_index.get(index) for index in self.held]
        utils = [None if gpu is None else gpu.utilization_gpu for gpu in seen]
        mems = [None if gpu is None else gpu.memory_used_mib for gpu in seen]
        gpuuse.add_sample(self.attempt, now, utils, mems)
        self.run.spool.reports.write_gpu_use(self.run.job.id, self.record)


def for_run(run: Run) -> Optional[Sampler]:
    """A sampler for a job that holds GPUs, else None."""
    held: Any = run.order.gpus
    return Sampler(run, tuple(held)) if held else None
