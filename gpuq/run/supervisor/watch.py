"""What a supervisor watches while its job runs, besides the job's exit and time limit: the GPU
sampler (gpusample.py) and, for a job whose events someone listens to (`--notify`, `--notify URL`,
`--on-finish`, its own or the worker's), whether it is stuck:

- its GPU sat idle (below 10%) longer than GPUQ_GPU_IDLE_MINUTES, as the sampler's record says (the
  flag `status` shows): GPU_IDLE, once per idle episode of each GPU (a new one begins after a busy
  sample);
- its progress did not move for GPUQ_STUCK_MINUTES (default 60; 0: never): its log gained no line
  of its own (what it gained since the last look is read, up to 64 KiB) and its progress file did
  not change size or time: STUCK, once until the job writes again.

Each event goes to run/hooks.during_run, which does not wait for the messages it sends.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from gpuq.engine.tracking import gpuuse
from gpuq.run import hooks
from gpuq.run.notify.message import GPU_IDLE, STUCK
from gpuq.run.supervisor import gpusample
from gpuq.run.supervisor.gpusample import Sampler
from gpuq.run.supervisor.start import LOG_PREFIX, Run, log_line

STUCK_ENV = "GPUQ_STUCK_MINUTES"
DEFAULT_STUCK_MINUTES = 60.0
MAX_LOOK_SECONDS = 60.0  # how often progress is looked at, at most (a quarter of the limit below that)
READ_AT_MOST = 65536  # bytes of what the log gained read per look: more than that is the job's own
PREFIX = LOG_PREFIX.encode()


def stuck_seconds() -> float:
    """GPUQ_STUCK_MINUTES in seconds; 0: not watched. A bad value: the default."""
    try:
        minutes = float(os.environ.get(STUCK_ENV) or DEFAULT_STUCK_MINUTES)
    except ValueError:
        minutes = DEFAULT_STUCK_MINUTES
    return max(0.0, minutes * 60) if minutes == minutes else DEFAULT_STUCK_MINUTES * 60  # NaN: the default


class Watch:
    """The sampler (if any) and the stuck checks, as wait.py calls a sampler: `seconds_left`
    until something is due, `take_if_due`."""

    def __init__(self, run: Run, sampler: Optional[Sampler]) -> None:
        self.run, self.sampler = run, sampler
        self.idle_limit = gpuuse.idle_limit_seconds()
        self.idle_said: dict[int, float] = {}  # GPU -> the idle episode (its start) already said
        self.stuck_limit = stuck_seconds()
        self.period = min(MAX_LOOK_SECONDS, self.stuck_limit / 4)
        self.progress_mark: Optional[tuple[int, int]] = None
        self.log_size = 0
        self._moved()
        self.moved_at = time.monotonic()
        self.stuck_said = False
        self.due = self.moved_at + self.period if self.stuck_limit else float("inf")

    def seconds_left(self) -> float:
        left = max(0.0, self.due - time.monotonic())
        return left if self.sampler is None else min(left, self.sampler.seconds_left())

    def take_if_due(self) -> None:
        if self.sampler is not None:
            self.sampler.take_if_due()
            self._check_idle()
        now = time.monotonic()
        if now >= self.due:
            self.due = now + self.period
            self._check_stuck(now)

    def _check_idle(self) -> None:
        assert self.sampler is not None
        attempt = self.sampler.attempt
        for gpu, seconds in gpuuse.idle_now(self.sampler.record, self.run.job["attempts"], self.idle_limit):
            since = attempt["idle_since"][attempt["gpus"].index(gpu)]
            if self.idle_said.get(gpu) != since:
                self.idle_said[gpu] = since
                self._event(GPU_IDLE, gpuuse.idle_text([(gpu, seconds)]))

    def _check_stuck(self, now: float) -> None:
        if self._moved():
            self.moved_at, self.stuck_said = now, False
        elif not self.stuck_said and now - self.moved_at >= self.stuck_limit:
            self.stuck_said = True
            minutes = (now - self.moved_at) / 60
            self._event(STUCK, f"no progress for {minutes:.0f} min (its log and progress file did not change)")

    def _moved(self) -> bool:
        """Whether the job wrote to its log (gpuq's own lines there do not count: an event's, a
        failed message's) or its progress file since the last look."""
        try:
            progress = os.stat(self.progress_path())
            mark = (progress.st_size, progress.st_mtime_ns)
        except OSError:
            mark = None
        moved, self.progress_mark = mark != self.progress_mark, mark
        try:
            size = os.fstat(self.run.log_fd).st_size
            new = os.pread(self.run.log_fd, READ_AT_MOST, self.log_size) if size > self.log_size else b""
        except OSError:
            return moved
        jobs_own = size < self.log_size or len(new) == READ_AT_MOST  # rewritten (a capped log), or plenty
        jobs_own = jobs_own or any(line and not line.startswith(PREFIX) for line in new.splitlines())
        self.log_size = size
        return moved or jobs_own

    def progress_path(self) -> str:
        return self.run.spool.reports.progress_path(self.run.job["id"])

    def _event(self, event: str, reason: str) -> None:
        log_line(self.run.log_fd, f"{event.replace('_', ' ')}: {reason}")
        try:
            hooks.during_run(self.run.spool, self.run.job, event, reason, self.run.order.hooks())
        except Exception as exc:  # noqa: BLE001 - the wait for the job must not end for this
            log_line(self.run.log_fd, f"could not tell of it: {exc!r}")


def for_run(run: Run) -> Optional[Watch | Sampler]:
    """What to watch while `run`'s job runs: its GPU sampler alone (or nothing, for a CPU job),
    unless someone listens to its events."""
    sampler = gpusample.for_run(run)
    job, order = run.job, run.order
    listened = job.get("notify") or job.get("notify_urls") or job.get("on_finish")
    listened = listened or order.notify or order.notify_urls or order.on_finish
    return Watch(run, sampler) if listened else sampler
