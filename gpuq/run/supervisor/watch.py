"""What a supervisor watches while its job runs, besides its exit and time limit: a GPU job's GPUs,
sampled into the attempt's record, and, for a job whose events someone listens to, whether it is
stuck: its GPU idle longer than GPUQ_GPU_IDLE_MINUTES (GPU_IDLE), or its log and progress file
unchanged for GPUQ_STUCK_MINUTES (STUCK). Driven by the wait: `seconds_left`, `take_if_due`.
"""

from __future__ import annotations

import os
import time
from typing import Optional, Union

from gpuq.core.times import duration, parse_iso
from gpuq.engine.tracking import gpuuse
from gpuq.run import hooks
from gpuq.run.notify.message import GPU_IDLE, STUCK
from gpuq.run.supervisor.start import LOG_PREFIX, Run, log_line
from gpuq.system import gpus

STUCK_ENV = "GPUQ_STUCK_MINUTES"
DEFAULT_STUCK_MINUTES = 60.0
MAX_LOOK_SECONDS = 60.0  # how often progress is looked at, at most (a quarter of the limit below that)
READ_AT_MOST = 65536  # bytes the log gained since the last look: that many or more are the job's own
PREFIX = LOG_PREFIX.encode()


class Sampler:
    def __init__(self, run: Run, held: tuple[int, ...]):
        self.run, self.held = run, list(held)
        self.period = gpuuse.sample_seconds()
        started = parse_iso(run.job.started_at) or time.time()
        self.record = run.spool.reports.read_gpu_use(run.job.id)
        attempts = self.record.get("attempts")
        self.record["attempts"] = attempts = attempts if isinstance(attempts, dict) else {}
        self.attempt = attempts[str(run.job.attempts)] = gpuuse.new_attempt(self.held, started)
        self.due = started + self.period
        self.failed = False

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.time())

    def take_if_due(self) -> bool:
        now = time.time()
        if now < self.due:
            return False
        self.due = now + self.period
        try:
            by_index = {gpu.index: gpu for gpu in gpus.look().gpus}
            seen = [by_index.get(index) for index in self.held]
            utils = [None if gpu is None else gpu.utilization_gpu for gpu in seen]
            mems = [None if gpu is None else gpu.memory_used_mib for gpu in seen]
            gpuuse.add_sample(self.attempt, now, utils, mems)
            self.run.spool.reports.write_gpu_use(self.run.job.id, self.record)
        except Exception as exc:  # noqa: BLE001 - figures only: the wait for the job must not end for this
            if not self.failed:
                log_line(self.run.log_fd, f"GPU utilisation not recorded: {exc}")
            self.failed = True
        return False


class Watch:
    def __init__(self, run: Run, sampler: Optional[Sampler]) -> None:
        self.run, self.sampler = run, sampler
        self.idle_limit = gpuuse.idle_limit_seconds()
        self.idle_said: dict[int, float] = {}  # GPU -> the idle episode (its start) already said
        try:
            minutes = float(os.environ.get(STUCK_ENV) or DEFAULT_STUCK_MINUTES)
        except ValueError:
            minutes = DEFAULT_STUCK_MINUTES
        minutes = minutes if minutes == minutes else DEFAULT_STUCK_MINUTES  # NaN: the default
        self.stuck_limit = max(0.0, minutes * 60)  # 0: not watched
        self.period = min(MAX_LOOK_SECONDS, self.stuck_limit / 4)
        self.progress_mark: Optional[tuple[int, int]] = None
        self.log_size = 0
        self._moved()
        self.moved_at = time.monotonic()
        self.stuck_said = False
        self.due = self.moved_at + self.period if self.stuck_limit else float("inf")

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def take_if_due(self) -> bool:
        if self.sampler is not None:  # it has just taken its sample (for_run: the sampler comes first)
            attempt = self.sampler.attempt
            for gpu, seconds in gpuuse.idle_now(self.sampler.record, self.run.job.attempts, self.idle_limit):
                since = attempt["idle_since"][attempt["gpus"].index(gpu)]
                if self.idle_said.get(gpu) != since:  # once per idle episode of each GPU
                    self.idle_said[gpu] = since
                    self._event(GPU_IDLE, gpuuse.idle_text([(gpu, seconds)]))
        now = time.monotonic()
        if now < self.due:
            return False
        self.due = now + self.period
        if self._moved():
            self.moved_at, self.stuck_said = now, False
        elif not self.stuck_said and now - self.moved_at >= self.stuck_limit:
            self.stuck_said = True
            still = duration(now - self.moved_at)  # `42s` under a minute (GPUQ_STUCK_MINUTES=0.5), not `0 min`
            self._event(STUCK, f"no progress for {still} (its log and progress file did not change)")
        return False

    def _moved(self) -> bool:
        """Whether the job wrote to its log (lines of its own) or its progress file since the last look."""
        try:
            progress = os.stat(self.run.spool.reports.progress_path(self.run.job.id))
            mark: Optional[tuple[int, int]] = (progress.st_size, progress.st_mtime_ns)
        except OSError:
            mark = None
        moved, self.progress_mark = mark != self.progress_mark, mark
        try:
            size = os.fstat(self.run.log_fd).st_size
            # read through a descriptor of its own: run.log_fd only appends (reading it fails, EBADF)
            grown = size > self.log_size
            new = self.run.spool.logs.read_from(self.run.job, self.log_size, READ_AT_MOST) if grown else b""
        except OSError:
            return moved
        jobs_own = size < self.log_size or len(new) >= READ_AT_MOST  # rewritten (a capped log), or plenty
        jobs_own = jobs_own or any(line and not line.startswith(PREFIX) for line in new.splitlines())
        self.log_size = size
        return moved or jobs_own

    def _event(self, event: str, reason: str) -> None:
        log_line(self.run.log_fd, f"{event.replace('_', ' ')}: {reason}")
        try:
            hooks.during_run(self.run.spool, self.run.job, event, reason, self.run.order.hooks())
        except Exception as exc:  # noqa: BLE001 - the wait for the job must not end for this
            log_line(self.run.log_fd, f"could not tell of it: {exc!r}")


def for_run(run: Run) -> list[Union[Sampler, Watch]]:
    """Its GPU sampler (none for a CPU job), then the watch if someone listens to its events."""
    job, order = run.job, run.order
    sampler = Sampler(run, order.gpus) if order.gpus else None
    looks: list[Union[Sampler, Watch]] = [] if sampler is None else [sampler]
    listened = job.notify or job.notify_urls or job.on_finish or order.notify or order.notify_urls or order.on_finish
    return [*looks, Watch(run, sampler)] if listened else looks
